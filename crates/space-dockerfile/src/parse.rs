//! From one logical line to [`Kind`]s: the keyword, builder flags (`--name=value`), and the
//! per-instruction argument rules. Most instructions give one kind; `ARG A B` gives one per name.

use crate::error::ParseError;
use crate::lines::LogicalLine;
use crate::{Command, Kind};

/// Shown whenever an instruction outside the subset is refused, so the user sees what to use.
const SUPPORTED: &str = "supported: FROM, RUN, COPY, ADD, ENV, WORKDIR, USER, ARG, CMD, ENTRYPOINT";

/// The instruction being parsed, for error messages.
#[derive(Clone, Copy)]
pub(crate) struct Context<'a> {
    pub line: usize,
    /// The keyword in upper case, as messages name it.
    pub keyword: &'a str,
}

impl Context<'_> {
    pub(crate) fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError::new(self.line, message)
    }
}

/// A builder flag before the arguments, `--name=value` or a bare `--name`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flag<'a> {
    pub name: &'a str,
    pub value: Option<&'a str>,
}

pub(crate) fn parse_line(logical: &LogicalLine) -> Result<Vec<Kind>, ParseError> {
    let content = logical.content.trim();
    let (keyword, rest) = match content.split_once(char::is_whitespace) {
        Some((keyword, rest)) => (keyword, rest.trim()),
        None => (content, ""),
    };
    let keyword = keyword.to_ascii_uppercase();
    let context = Context { line: logical.line, keyword: &keyword };
    let kind = match keyword.as_str() {
        "FROM" => from(context, rest)?,
        "RUN" => run(context, rest)?,
        "CMD" => Kind::Cmd { command: command(context, rest)? },
        "ENTRYPOINT" => Kind::Entrypoint { command: command(context, rest)? },
        "COPY" => crate::copy::copy(context, rest, false)?,
        "ADD" => crate::copy::copy(context, rest, true)?,
        "ENV" => crate::env::env(context, rest)?,
        "ARG" => return crate::env::arg(context, rest),
        "WORKDIR" => Kind::Workdir { path: single_argument(context, rest, "a path")? },
        "USER" => Kind::User { user: single_argument(context, rest, "a user")? },
        _ => return Err(context.error(format!("{keyword} is not supported by space template build ({SUPPORTED})"))),
    };
    Ok(vec![kind])
}

/// Splits off the leading `--flags`, as Docker does for every instruction; a lone `--` ends them.
pub(crate) fn take_flags(mut rest: &str) -> (Vec<Flag<'_>>, &str) {
    let mut flags = Vec::new();
    while let Some(flag) = rest.strip_prefix("--") {
        let (word, after) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
        rest = after.trim_start();
        if word.is_empty() {
            break;
        }
        let (name, value) = match word.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (word, None),
        };
        flags.push(Flag { name, value });
    }
    (flags, rest)
}

/// For instructions that take no flags in this subset: the first one is refused by name.
pub(crate) fn refuse_flags(context: Context<'_>, flags: &[Flag<'_>]) -> Result<(), ParseError> {
    match flags.first() {
        Some(flag) => Err(context.error(format!("{} --{} is not supported", context.keyword, flag.name))),
        None => Ok(()),
    }
}

fn from(context: Context<'_>, rest: &str) -> Result<Kind, ParseError> {
    let (flags, rest) = take_flags(rest);
    refuse_flags(context, &flags)?;
    let words: Vec<&str> = rest.split_whitespace().collect();
    match words.as_slice() {
        [] => Err(context.error("FROM needs an image")),
        [image] => Ok(Kind::From { image: (*image).to_string() }),
        [_, as_word, ..] if as_word.eq_ignore_ascii_case("as") => {
            Err(context.error("multi-stage builds (FROM … AS) are not supported"))
        }
        _ => Err(context.error(format!("FROM takes one image, not {:?}", rest))),
    }
}

fn run(context: Context<'_>, rest: &str) -> Result<Kind, ParseError> {
    let command = command(context, rest)?;
    match &command {
        Command::Exec(args) if args.is_empty() => Err(context.error("RUN needs a command, not an empty list")),
        _ => Ok(Kind::Run { command }),
    }
}

/// RUN, CMD and ENTRYPOINT arguments: a JSON string array is the exec form; anything else,
/// even a malformed array, is the shell form, as in Docker.
fn command(context: Context<'_>, rest: &str) -> Result<Command, ParseError> {
    let (flags, rest) = take_flags(rest);
    refuse_flags(context, &flags)?;
    if let Some(args) = json_array(rest) {
        return Ok(Command::Exec(args));
    }
    if rest.is_empty() {
        return Err(context.error(format!("{} needs a command", context.keyword)));
    }
    if context.keyword == "RUN" {
        refuse_heredoc(context, rest)?;
    }
    Ok(Command::Shell(rest.to_string()))
}

/// The exec form: `rest` parsed as a JSON array of strings, if it is one.
pub(crate) fn json_array(rest: &str) -> Option<Vec<String>> {
    if !rest.starts_with('[') {
        return None;
    }
    serde_json::from_str(rest).ok()
}

/// BuildKit reads `<<EOF` (also `<<-EOF`, `<<"EOF"`, `2<<EOF`) as a heredoc whose body is on
/// the following lines; without heredoc support those lines would be misread as instructions,
/// so the instruction is refused here instead.
pub(crate) fn refuse_heredoc(context: Context<'_>, rest: &str) -> Result<(), ParseError> {
    match rest.split_whitespace().find(|word| is_heredoc(word)) {
        Some(word) => Err(context.error(format!("heredocs ({word}) are not supported by space template build"))),
        None => Ok(()),
    }
}

/// BuildKit's rule on a whitespace-separated word: `^\d*<<-?[^<]+$`.
fn is_heredoc(word: &str) -> bool {
    let Some(name) = word.trim_start_matches(|c: char| c.is_ascii_digit()).strip_prefix("<<") else {
        return false;
    };
    let name = name.strip_prefix('-').unwrap_or(name);
    !name.is_empty() && !name.contains('<')
}

/// WORKDIR and USER: the rest of the line, which must not be empty.
fn single_argument(context: Context<'_>, rest: &str, what: &str) -> Result<String, ParseError> {
    let (flags, rest) = take_flags(rest);
    refuse_flags(context, &flags)?;
    if rest.is_empty() {
        return Err(context.error(format!("{} needs {what}", context.keyword)));
    }
    Ok(rest.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(content: &str) -> Result<Vec<Kind>, ParseError> {
        parse_line(&LogicalLine { line: 7, text: content.to_string(), content: content.to_string() })
    }

    fn kind(content: &str) -> Kind {
        let mut kinds = kinds(content).unwrap();
        assert_eq!(kinds.len(), 1);
        kinds.remove(0)
    }

    fn refused(content: &str, phrase: &str) {
        let error = kinds(content).unwrap_err();
        assert_eq!(error.line, 7, "{error}");
        assert!(error.message.contains(phrase), "{content:?}: {error}");
    }

    fn shell(text: &str) -> Command {
        Command::Shell(text.to_string())
    }

    fn exec(args: &[&str]) -> Command {
        Command::Exec(args.iter().map(|a| a.to_string()).collect())
    }

    #[test]
    fn keywords_are_case_insensitive() {
        assert_eq!(kind("from alpine:3"), Kind::From { image: "alpine:3".to_string() });
        assert_eq!(kind("Run  make  all "), Kind::Run { command: shell("make  all") });
        assert_eq!(kind("workdir /srv"), Kind::Workdir { path: "/srv".to_string() });
    }

    #[test]
    fn takes_flags() {
        let (flags, rest) = take_flags("--a=1 --b  c d");
        assert_eq!(flags, vec![Flag { name: "a", value: Some("1") }, Flag { name: "b", value: None }]);
        assert_eq!(rest, "c d");
        let (flags, rest) = take_flags("--a= -- --not-a-flag");
        assert_eq!(flags, vec![Flag { name: "a", value: Some("") }]);
        assert_eq!(rest, "--not-a-flag");
        assert_eq!(take_flags("plain --x"), (vec![], "plain --x"));
    }

    #[test]
    fn commands_in_both_forms() {
        assert_eq!(kind("RUN [\"a\", \"b c\"]"), Kind::Run { command: exec(&["a", "b c"]) });
        assert_eq!(kind("CMD [\"a\"]"), Kind::Cmd { command: exec(&["a"]) });
        assert_eq!(kind("CMD []"), Kind::Cmd { command: exec(&[]) });
        assert_eq!(kind("ENTRYPOINT exec ./run"), Kind::Entrypoint { command: shell("exec ./run") });
        assert_eq!(kind("RUN [ -f x ] && y"), Kind::Run { command: shell("[ -f x ] && y") });
        assert_eq!(kind("CMD [\"a\", 1]"), Kind::Cmd { command: shell("[\"a\", 1]") });
        assert_eq!(kind("ENTRYPOINT ['a']"), Kind::Entrypoint { command: shell("['a']") });
        assert_eq!(kind("RUN echo a<<b"), Kind::Run { command: shell("echo a<<b") });
        assert_eq!(kind("RUN cat <<< hi"), Kind::Run { command: shell("cat <<< hi") });
    }

    #[test]
    fn refuses_empty_commands() {
        refused("RUN", "RUN needs a command");
        refused("RUN   ", "RUN needs a command");
        refused("RUN []", "RUN needs a command");
        refused("CMD", "CMD needs a command");
        refused("ENTRYPOINT", "ENTRYPOINT needs a command");
    }

    #[test]
    fn refuses_run_flags_by_name() {
        refused("RUN --mount=type=cache,target=/root/.cache make", "RUN --mount is not supported");
        refused("RUN --network=none make", "RUN --network is not supported");
        refused("RUN --security=insecure make", "RUN --security is not supported");
        refused("CMD --help", "CMD --help is not supported");
    }

    #[test]
    fn refuses_heredocs() {
        refused("RUN <<EOF", "heredocs (<<EOF) are not supported");
        refused("RUN python3 <<-'PY'", "heredocs (<<-'PY') are not supported");
        refused("RUN cat 2<<END > /x", "heredocs (2<<END)");
    }

    #[test]
    fn from_takes_one_image() {
        refused("FROM", "FROM needs an image");
        refused("FROM golang:1 AS build", "multi-stage builds (FROM … AS) are not supported");
        refused("FROM golang:1 as build", "multi-stage builds (FROM … AS) are not supported");
        refused("FROM --platform=linux/arm64 alpine", "FROM --platform is not supported");
        refused("FROM a b", "FROM takes one image");
    }

    #[test]
    fn workdir_and_user_need_an_argument() {
        assert_eq!(kind("USER app:app"), Kind::User { user: "app:app".to_string() });
        assert_eq!(kind("WORKDIR /my dir"), Kind::Workdir { path: "/my dir".to_string() });
        refused("WORKDIR", "WORKDIR needs a path");
        refused("USER  ", "USER needs a user");
    }

    #[test]
    fn refuses_other_instructions_naming_them() {
        for content in [
            "LABEL a=b",
            "EXPOSE 80",
            "VOLUME /data",
            "HEALTHCHECK CMD true",
            "ONBUILD RUN x",
            "SHELL [\"bash\"]",
            "STOPSIGNAL TERM",
            "MAINTAINER me",
            "expose 80",
            "FOO",
        ] {
            let keyword = content.split(' ').next().unwrap_or_default().to_ascii_uppercase();
            refused(
                content,
                &format!(
                    "{keyword} is not supported by space template build (supported: FROM, RUN, COPY, ADD, ENV, \
                     WORKDIR, USER, ARG, CMD, ENTRYPOINT)"
                ),
            );
        }
    }
}
