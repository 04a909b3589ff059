//! Configuration errors: which file, which key path, why.

use std::fmt;
use std::path::Path;

use crate::validate::Issue;

/// One or more problems in one configuration file.
#[derive(Debug, Clone)]
pub struct ConfigError {
    /// The file, as the user named it.
    pub file: String,
    /// What is wrong, with key paths.
    pub issues: Vec<Issue>,
}

impl ConfigError {
    /// Problems in `file`.
    pub fn new(file: &Path, issues: Vec<Issue>) -> Self {
        ConfigError { file: file.display().to_string(), issues }
    }
    /// A single problem in `file` at `path`.
    pub fn one(file: &Path, path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::new(file, vec![Issue::new(path, reason)])
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {issue}", self.file)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}
