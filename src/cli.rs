//! Command line: `weir [-p|--prefix DIR] [-t|--test] [-v|--version] [-h|--help]`.

use std::ffi::OsString;
use std::path::PathBuf;

/// What the user asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command {
    /// Run the gateway.
    Run {
        /// Prefix directory.
        prefix: PathBuf,
    },
    /// Check configuration and resources, then exit (like `nginx -t`).
    Test {
        /// Prefix directory.
        prefix: PathBuf,
    },
    /// Print the version.
    Version,
    /// Print usage.
    Help,
}

/// Usage text.
pub const USAGE: &str = "\
Usage: weir [OPTIONS]

Options:
  -p, --prefix DIR   prefix directory; configuration is read from DIR/conf (default: .)
  -t, --test         check configuration and resources, then exit (0: valid, 1: invalid)
  -v, --version      print the version and exit
  -h, --help         print this help and exit

Environment:
  RUST_LOG           log filter (default: info), e.g. RUST_LOG=weir=debug
";

/// Parses the arguments (without the program name).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, String> {
    let mut prefix = PathBuf::from(".");
    let mut test = false;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        match text.as_str() {
            "-h" | "--help" => return Ok(Command::Help),
            "-v" | "-V" | "--version" => return Ok(Command::Version),
            "-t" | "--test" => test = true,
            "-p" | "--prefix" => {
                prefix = args.next().map(PathBuf::from).ok_or_else(|| format!("{text} needs a directory"))?;
            }
            other => {
                if let Some(dir) = other.strip_prefix("--prefix=") {
                    prefix = PathBuf::from(dir);
                } else {
                    return Err(format!("unknown argument `{other}`"));
                }
            }
        }
    }
    Ok(if test { Command::Test { prefix } } else { Command::Run { prefix } })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(p(&[]), Ok(Command::Run { prefix: ".".into() }));
        assert_eq!(p(&["-p", "/x"]), Ok(Command::Run { prefix: "/x".into() }));
        assert_eq!(p(&["-t", "--prefix", "/x"]), Ok(Command::Test { prefix: "/x".into() }));
        assert_eq!(p(&["--prefix=/y"]), Ok(Command::Run { prefix: "/y".into() }));
        assert_eq!(p(&["--version"]), Ok(Command::Version));
        assert!(p(&["-p"]).is_err());
        assert!(p(&["--bogus"]).is_err());
    }
}
