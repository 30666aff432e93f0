//! `space`: the client of the API; server commands run in `space-server` beside it.

fn main() -> std::process::ExitCode {
    space_cli::client_main()
}
