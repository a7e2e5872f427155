//! `reservoir`: drive and inspect the Reservoir caching allocator (the
//! command line is [`reservoir_cli::run`]).

fn main() {
    std::process::exit(reservoir_cli::run(std::env::args_os()));
}
