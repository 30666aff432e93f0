//! Errors of the daemon itself, and the mapping of I/O errors onto protocol error kinds.

use std::io;

use space_proto::{ErrorKind, Reply};

/// Why the daemon could not start or keep serving.
#[derive(Debug, thiserror::Error)]
pub enum SpacedError {
    #[error("cannot bind {0}: {1}")]
    Bind(String, #[source] io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] io::Error),
    #[error("cannot use the listening socket: {0}")]
    Listener(#[source] io::Error),
    #[error("cannot install signal handlers: {0}")]
    Signals(#[source] io::Error),
    #[error(transparent)]
    Init(#[from] space_sandbox_init::InitError),
    #[error(transparent)]
    FindPort(#[from] crate::port::PortError),
    #[error("the agent port failed: {0}")]
    Port(#[source] io::Error),
}

/// The protocol error kind for an I/O error. Raw errno values are checked first because
/// `std::io::ErrorKind` folds several of them together (e.g. EPERM and EACCES).
pub fn io_kind(err: &io::Error) -> ErrorKind {
    if let Some(code) = err.raw_os_error() {
        return match code {
            libc::ENOENT => ErrorKind::NotFound,
            libc::EACCES | libc::EPERM | libc::EROFS => ErrorKind::PermissionDenied,
            libc::EEXIST => ErrorKind::AlreadyExists,
            libc::ENOTDIR => ErrorKind::NotADirectory,
            libc::EISDIR => ErrorKind::IsADirectory,
            libc::ENOTEMPTY => ErrorKind::DirectoryNotEmpty,
            // EBUSY: the path is a mount point (such as the sandbox's /dev/null) or otherwise
            // held by the system; the request cannot work, the sandbox is fine.
            libc::EINVAL | libc::ENAMETOOLONG | libc::ELOOP | libc::EBUSY => ErrorKind::InvalidInput,
            libc::ESRCH => ErrorKind::NoSuchProcess,
            libc::ENOTSUP => ErrorKind::Unsupported,
            libc::ENOSPC => ErrorKind::StorageFull,
            libc::EDQUOT => ErrorKind::QuotaExceeded,
            _ => ErrorKind::Other,
        };
    }
    match err.kind() {
        io::ErrorKind::NotFound => ErrorKind::NotFound,
        io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
        io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
        io::ErrorKind::NotADirectory => ErrorKind::NotADirectory,
        io::ErrorKind::IsADirectory => ErrorKind::IsADirectory,
        io::ErrorKind::DirectoryNotEmpty => ErrorKind::DirectoryNotEmpty,
        io::ErrorKind::InvalidInput | io::ErrorKind::InvalidFilename => ErrorKind::InvalidInput,
        io::ErrorKind::Unsupported => ErrorKind::Unsupported,
        _ => ErrorKind::Other,
    }
}

/// An error reply for a failed operation on `what` (usually a path).
pub fn io_reply(what: &str, err: &io::Error) -> Reply {
    let hint = match err.raw_os_error() {
        Some(libc::EBUSY) => "; it is a mount point or in use by the system, and cannot be replaced or removed",
        _ => "",
    };
    Reply::error(io_kind(err), format!("{what}: {}{hint}", describe(err)))
}

/// The OS description of an error without std's " (os error N)" suffix.
pub fn describe(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_owned(),
        None => err.to_string(),
    }
}

/// Shorthand for an `InvalidInput` reply.
pub fn invalid(message: impl Into<String>) -> Reply {
    Reply::error(ErrorKind::InvalidInput, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_values_map_to_kinds() {
        let cases = [
            (libc::ENOENT, ErrorKind::NotFound),
            (libc::EPERM, ErrorKind::PermissionDenied),
            (libc::EEXIST, ErrorKind::AlreadyExists),
            (libc::ENOTDIR, ErrorKind::NotADirectory),
            (libc::EISDIR, ErrorKind::IsADirectory),
            (libc::ENOTEMPTY, ErrorKind::DirectoryNotEmpty),
            (libc::EBUSY, ErrorKind::InvalidInput),
            (libc::ENOSPC, ErrorKind::StorageFull),
            (libc::EDQUOT, ErrorKind::QuotaExceeded),
            (libc::EIO, ErrorKind::Other),
        ];
        for (code, kind) in cases {
            assert_eq!(io_kind(&io::Error::from_raw_os_error(code)), kind, "errno {code}");
        }
        let plain = io::Error::new(io::ErrorKind::InvalidInput, "nul byte");
        assert_eq!(io_kind(&plain), ErrorKind::InvalidInput);
    }

    /// Replacing or removing a mount point such as /dev/null is the request's fault: a client
    /// error that says why, not an internal one.
    #[test]
    fn busy_paths_are_the_requests_fault() {
        let reply = io_reply("/dev/null", &io::Error::from_raw_os_error(libc::EBUSY));
        let Reply::Error { kind, message } = reply else { panic!("{reply:?}") };
        assert_eq!(kind, ErrorKind::InvalidInput);
        assert!(message.starts_with("/dev/null: Device or resource busy; it is a mount point"), "{message}");
    }

    #[test]
    fn descriptions_have_no_errno_suffix() {
        let err = io::Error::from_raw_os_error(libc::ENOENT);
        assert_eq!(describe(&err), "No such file or directory");
    }
}
