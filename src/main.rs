//! The `weir` binary.

use std::process::ExitCode;

use weir::cli::{self, Command};
use weir::config::Prefix;
use weir::state::Gateway;

#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at start-up (`MALLOC_CONF` in the environment still overrides).
/// A background thread returns freed pages to the OS on jemalloc's decay schedule: without it
/// pages are only returned when some thread allocates, so a gateway that goes quiet (idle
/// keep-alive clients, parked connections) would keep its peak memory resident.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[allow(unsafe_code)] // jemalloc reads its start-up options from this exported symbol
#[export_name = "malloc_conf"]
static MALLOC_CONF: ConfString = ConfString(c"background_thread:true".as_ptr());

/// A C string pointer jemalloc reads at start-up.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[repr(transparent)]
struct ConfString(*const std::ffi::c_char);

// SAFETY: the pointer is to a string literal: immutable and alive for the whole program.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[allow(unsafe_code)]
unsafe impl Sync for ConfString {}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Pipe(Box::new(weir::error_log::Writer)))
        .init();
    weir::silence_tracing();
    weir::tls::install_default_provider();
    // Before any thread starts: what the binary upgrade's previous process handed over.
    weir::handover::init();
    let command = match cli::parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("weir: {e}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    if let Err(e) = weir::try_plugins_catalog() {
        eprintln!("weir: {e}");
        return ExitCode::FAILURE;
    }
    match command {
        Command::Help => {
            print!("{}", cli::USAGE);
            ExitCode::SUCCESS
        }
        Command::Version => {
            println!("weir {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        Command::Test { prefix } => {
            let prefix = Prefix::new(prefix);
            match Gateway::check(prefix.clone()) {
                Ok(_) => {
                    println!(
                        "weir: configuration {} and resources {} are valid",
                        prefix.config_file().display(),
                        prefix.resources_file().display()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    eprintln!("weir: configuration test failed");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Run { prefix } => match weir::run::run(Prefix::new(prefix)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{e}");
                eprintln!("weir: not started");
                ExitCode::FAILURE
            }
        },
    }
}
