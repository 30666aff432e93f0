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

impl<T: Args> Args for Deferred<T> {
    fn augment_args(cmd: Command) -> Command {
        cmd.defer(T::augment_args)
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        cmd.defer(T::augment_args_for_update)
    }

    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

impl<T: Subcommand> Subcommand for Deferred<T> {
    fn augment_subcommands(cmd: Command) -> Command {
        cmd.defer(T::augment_subcommands)
    }

    fn augment_subcommands_for_update(cmd: Command) -> Command {
        cmd.defer(T::augment_subcommands_for_update)
    }

    fn has_subcommand(name: &str) -> bool {
        T::has_subcommand(name)
    }
}
