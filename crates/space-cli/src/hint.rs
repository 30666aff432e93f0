//! The hint printed when `space exec ID CMD…` lacks the `--` that separates the command from
//! `space`'s own flags (clap then reads the command's flags, like `-la`, as ours).

/// Flags of `space` and `space exec` that take a value as the next argument.
const VALUE_FLAGS: [&str; 8] = ["--url", "--api-key", "--data-dir", "-e", "--env", "-w", "--cwd", "--timeout"];

/// "put `--` before the command: space exec ID -- ls -la" when `args` (without the program
/// name) run `exec` with a command but no `--`; `None` otherwise.
pub fn missing_double_dash(args: &[String]) -> Option<String> {
    if args.iter().any(|a| a == "--") {
        return None;
    }
    let mut positionals = positionals(args);
    let (exec, _) = positionals.next()?;
    if args[exec] != "exec" {
        return None;
    }
    let (id, _) = positionals.next()?;
    let command = &args[id + 1..];
    if command.is_empty() {
        return None;
    }
    let flags = args[exec + 1..id].join(" ");
    let flags = if flags.is_empty() { String::new() } else { format!("{flags} ") };
    Some(format!("put `--` before the command: space exec {flags}{} -- {}", args[id], command.join(" ")))
}

/// The indexes of arguments that are neither flags nor a flag's value.
fn positionals(args: &[String]) -> impl Iterator<Item = (usize, &String)> {
    let mut skip_next = false;
    args.iter().enumerate().filter(move |(_, a)| {
        if std::mem::take(&mut skip_next) {
            return false;
        }
        if a.starts_with('-') {
            skip_next = VALUE_FLAGS.contains(&a.as_str());
            return false;
        }
        true
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(line: &str) -> Option<String> {
        missing_double_dash(&line.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
    }

    #[test]
    fn hints_only_when_an_exec_command_lacks_the_double_dash() {
        assert_eq!(hint("exec s1 ls -la").unwrap(), "put `--` before the command: space exec s1 -- ls -la");
        assert_eq!(
            hint("--url http://x exec -e A=1 -t s1 sh -c true").unwrap(),
            "put `--` before the command: space exec -e A=1 -t s1 -- sh -c true"
        );
        assert_eq!(hint("exec s1 ls -- -la"), None);
        assert_eq!(hint("exec s1"), None);
        assert_eq!(hint("session list -la"), None);
        assert_eq!(hint("--data-dir exec session ls"), None);
    }
}
