//! `hawser rtl`: see what Sybase RTL net-row compilation makes of a run of DML.
//!
//! `compile` reads CREATE TABLE and single-row INSERT / UPDATE / DELETE statements (the
//! Sybase forms run as written: `insert T values (1, 10)`, `delete T where k = 1`) in log
//! order, one transaction each, and prints the net operations per table with counts.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

#[derive(Args, Debug)]
pub struct RtlArgs {
    #[command(subcommand)]
    command: RtlCommand,
}

#[derive(Subcommand, Debug)]
enum RtlCommand {
    /// Compile a DML run into net row operations.
    Compile {
        /// Script file; `-` or nothing reads standard input.
        file: Option<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = RtlFormat::Sql)]
        format: RtlFormat,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RtlFormat {
    /// The net statements in the script's own style, with a count comment.
    Sql,
    /// The compilation as one JSON object.
    Json,
}

pub async fn run(args: RtlArgs) -> anyhow::Result<ExitCode> {
    let RtlCommand::Compile { file, format } = args.command;
    let (name, source) = match file {
        Some(path) if path.as_os_str() != "-" => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            (path.display().to_string(), text)
        }
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("read standard input")?;
            ("-".to_string(), text)
        }
    };
    match hawser_rtl::compile_script(&source) {
        Ok(out) => {
            match format {
                RtlFormat::Sql => print!("{}", out.render_sql()),
                RtlFormat::Json => println!("{}", out.to_json()),
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{name}: error: {e}");
            Ok(ExitCode::FAILURE)
        }
    }
}
