//! `spaced init` — pid 1 of a sandbox: set the sandbox up, then serve the node.
//! `spaced serve --socket PATH` — the same server on a fresh unix socket, without any
//! sandboxing (tests on the host).
//! `spaced guest --port NAME` — pid 1 of a `vm` sandbox: the same server on the virtio-serial
//! port NAME, after the initramfs's /init has set the VM up.

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str =
    "usage: spaced init\n       spaced serve --socket PATH\n       spaced guest --port NAME\n       spaced --version";

enum Command {
    Init,
    Serve { socket: PathBuf },
    Guest { port: String },
    Version,
}

fn parse(args: &[String]) -> Result<Command, String> {
    match args {
        [cmd] if cmd == "init" => Ok(Command::Init),
        [cmd, flag, path] if cmd == "serve" && flag == "--socket" => Ok(Command::Serve { socket: path.into() }),
        [cmd, flag, name] if cmd == "guest" && flag == "--port" => Ok(Command::Guest { port: name.clone() }),
        [flag] if flag == "--version" || flag == "-V" => Ok(Command::Version),
        _ => Err(USAGE.to_owned()),
    }
}

fn run(command: Command) -> Result<(), spaced::SpacedError> {
    match command {
        Command::Init => {
            // Must come first: entering namespaces needs a single-threaded process, and
            // the runtime starts threads.
            let outcome = space_sandbox_init::run_init()?;
            spaced::run(outcome.listener, spaced::Mode::Init)
        }
        Command::Serve { socket } => {
            // Orphans of our commands come back to us, as they would to pid 1.
            if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
                eprintln!("spaced: warning: cannot become a child subreaper: {e}");
            }
            spaced::run(spaced::bind(&socket)?, spaced::Mode::Serve)
        }
        Command::Guest { port } => {
            // As the VM's pid 1 spaced inherits every orphan; started as any other process (a
            // test), it asks for those of its commands.
            if nix::unistd::getpid().as_raw() != 1
                && let Err(e) = nix::sys::prctl::set_child_subreaper(true)
            {
                eprintln!("spaced: warning: cannot become a child subreaper: {e}");
            }
            spaced::run_guest(&port)
        }
        Command::Version => {
            println!("{}", spaced::agent_name());
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse(&args) {
        Ok(command) => command,
        Err(usage) => {
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    match run(command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("spaced: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn guest_takes_a_port_name() {
        assert!(matches!(parse(&args(&["guest", "--port", "agent"])), Ok(Command::Guest { port }) if port == "agent"));
        assert!(parse(&args(&["guest"])).is_err());
        assert!(parse(&args(&["guest", "--socket", "agent"])).is_err());
    }
}
