//! The crate's one error type, and the exit code each error means to a script.

use std::fmt;

use nodus_core::engine::Reason;

/// Exit codes a script can rely on (also in `nodus --help` and docs/cli.md).
pub mod exit {
    /// The command did what it was asked.
    pub const OK: u8 = 0;
    /// The server refused the request, or the input (a file, a patch) cannot be used.
    pub const REFUSED: u8 = 1;
    /// The command line is wrong: what clap finds, and what the commands find in their own
    /// arguments (a kind, `KIND/NAME`, `--for`, `--timeout`, `--deadline`, a label).
    pub const USAGE: u8 = 2;
    /// The server cannot be reached, or no usable login (no context, token not accepted).
    pub const UNREACHABLE: u8 = 3;
    /// `wait` timed out.
    pub const TIMEOUT: u8 = 4;
    /// `wait` gave up: the resource finished in a state that can never meet the condition.
    pub const NEVER: u8 = 5;
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server answered with an error status.
    #[error("Error from server ({reason}): {message}")]
    Server {
        /// The HTTP status.
        code: u16,
        /// The stable reason (`NotFound`, `Invalid`, `Conflict`, …).
        reason: Reason,
        /// The server's sentence.
        message: String,
    },
    /// The server cannot be reached, or its answer could not be read.
    #[error("cannot reach the Nodus server at {server}: {reason}")]
    Unreachable {
        /// The server's URL.
        server: String,
        /// Why.
        reason: String,
    },
    /// There is no login to use.
    #[error("{0}")]
    NotLoggedIn(String),
    /// The input cannot be used: a file, a document, a patch.
    #[error("{0}")]
    Input(String),
    /// The command line is wrong: an argument or a flag's value.
    #[error("{0}")]
    Usage(String),
    /// The config file cannot be read or written.
    #[error("config file {path}: {reason}")]
    Config {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// `wait` ran out of time.
    #[error("{0}")]
    Timeout(String),
    /// `wait` can never succeed.
    #[error("{0}")]
    NeverMet(String),
    /// The server (`nodus server`) could not start or stopped with an error.
    #[error("{0}")]
    Start(String),
    /// Errors already printed one by one (as `apply` does for each document).
    #[error("{count} of the objects failed")]
    Reported {
        /// How many failed.
        count: usize,
        /// The exit code of the worst of them.
        code: u8,
    },
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Server {
                reason: Reason::Unauthorized,
                ..
            } => exit::UNREACHABLE,
            Error::Server { .. } | Error::Input(_) | Error::Config { .. } | Error::Start(_) => {
                exit::REFUSED
            }
            Error::Usage(_) => exit::USAGE,
            Error::Unreachable { .. } | Error::NotLoggedIn(_) => exit::UNREACHABLE,
            Error::Timeout(_) => exit::TIMEOUT,
            Error::NeverMet(_) => exit::NEVER,
            Error::Reported { code, .. } => *code,
        }
    }

    /// Whether the server said the object does not exist.
    pub fn is_not_found(&self) -> bool {
        self.reason() == Some(Reason::NotFound)
    }

    /// The reason the server gave, when it refused.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Error::Server { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// An input error with a message.
    pub fn input(message: impl fmt::Display) -> Self {
        Error::Input(message.to_string())
    }

    /// A usage error (the command line is wrong) with a message.
    pub fn usage(message: impl fmt::Display) -> Self {
        Error::Usage(message.to_string())
    }

    /// How the error is printed: the server's errors as kubectl prints them, the rest with
    /// `error: `; errors already reported print nothing more.
    pub fn render(&self) -> String {
        match self {
            Error::Server { .. } => self.to_string(),
            Error::Reported { .. } => String::new(),
            _ => format!("error: {self}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_follow_the_documented_table() {
        let refused = Error::Server {
            code: 409,
            reason: Reason::AgentRunFinished,
            message: "the run has finished".into(),
        };
        assert_eq!(refused.exit_code(), exit::REFUSED);
        assert_eq!(
            refused.render(),
            "Error from server (AgentRunFinished): the run has finished"
        );
        let unauthorized = Error::Server {
            code: 401,
            reason: Reason::Unauthorized,
            message: "no".into(),
        };
        assert_eq!(unauthorized.exit_code(), exit::UNREACHABLE);
        let down = Error::Unreachable {
            server: "http://127.0.0.1:7070".into(),
            reason: "connection refused".into(),
        };
        assert_eq!(down.exit_code(), exit::UNREACHABLE);
        assert!(down.render().starts_with("error: cannot reach"));
        assert_eq!(Error::Timeout("t".into()).exit_code(), exit::TIMEOUT);
        assert_eq!(Error::NeverMet("n".into()).exit_code(), exit::NEVER);
        assert_eq!(Error::input("bad").exit_code(), exit::REFUSED);
        assert_eq!(Error::usage("bad").exit_code(), exit::USAGE);
    }
}
