//! Config errors with the file, line and column they are about, and the
//! places of the socket addresses (for bind errors at start).

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{Config, file};

/// One problem in a config file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem has no single place (e.g. the file is unreadable).
    pub line: u64,
    pub column: u64,
    pub problem: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.problem)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.problem
            )
        }
    }
}

/// A line and column in the config file (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Place {
    pub line: u64,
    pub column: u64,
}

/// Where the socket addresses are written: one place per `listen` address,
/// and the admin address's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Places {
    pub listen: Vec<Place>,
    pub admin: Option<Place>,
}

impl Config {
    /// `file:line:column` of `addr` as a `listen` or `admin` address, for
    /// messages about binding it.
    pub fn place_of(&self, addr: SocketAddr) -> String {
        let place = self
            .listen
            .iter()
            .position(|&l| l == addr)
            .and_then(|i| self.places.listen.get(i).copied())
            .or(self.places.admin.filter(|_| self.admin == Some(addr)));
        match place {
            Some(p) => format!("{}:{}:{}", self.source.display(), p.line, p.column),
            None => self.source.display().to_string(),
        }
    }
}

/// All the problems found in one config file (never empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    /// The file could not be read as a config at all.
    pub fn of_file(path: &Path, e: &file::FileError) -> ConfigErrors {
        let (line, column) = match e {
            file::FileError::NotUtf8 { line, column } => (*line, *column),
            _ => (0, 0),
        };
        ConfigErrors(vec![ConfigError {
            file: path.to_path_buf(),
            line,
            column,
            problem: e.to_string(),
        }])
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}
