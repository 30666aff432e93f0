//! Commands whose flags clap builds only when the command is chosen (or its help asked for):
//! building every command's flags for every run is most of a short command's time in clap, and
//! `space` has hundreds of them. Top-level `--help` still lists every command, with its line.

use clap::{ArgMatches, Args, Command, FromArgMatches, Subcommand};

/// `T`'s flags (an `Args`) or subcommands (a `Subcommand`), built on demand.
pub struct Deferred<T>(pub T);

impl<T: FromArgMatches> FromArgMatches for Deferred<T> {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Deferred)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
}

/// Builds `cmd` with `build`, keeping the description it was given: the derive sets the
/// command's own description (its variant's doc) before a deferred build runs, and the type's
/// doc, which `build` would set, must not replace it.
fn keeping_about(cmd: Command, build: fn(Command) -> Command) -> Command {
    let (about, long_about) = (cmd.get_about().cloned(), cmd.get_long_about().cloned());
    let built = build(cmd);
    let Some(about) = about else { return built };
    match long_about {
        Some(long) => built.about(about).long_about(long),
        None => built.about(about).long_about(None::<&'static str>),
    }
}

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: Command) -> Command {
        cmd.defer(|cmd| keeping_about(cmd, T::augment_args))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        cmd.defer(|cmd| keeping_about(cmd, T::augment_args_for_update))
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: Subcommand> Subcommand for Deferred<T> {
    fn augment_subcommands(cmd: Command) -> Command {
        cmd.defer(|cmd| keeping_about(cmd, T::augment_subcommands))
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        cmd.defer(|cmd| keeping_about(cmd, T::augment_subcommands_for_update))
    }

    fn has_subcommand(name: &str) -> bool {
        T::has_subcommand(name)
    }
}
