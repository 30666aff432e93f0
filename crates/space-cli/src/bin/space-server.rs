//! `space-server`: the server, node and every other command of `space`.

fn main() -> std::process::ExitCode {
    space_cli::server_main()
}
