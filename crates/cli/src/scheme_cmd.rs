//! `hawser scheme`: offline tools for replication schemes (no server needed).
//!
//! `check` validates files of CREATE / ALTER / DROP REPLICATION statements and reports
//! problems like a compiler (`FILE:LINE:COL: error[CODE]: message` with a caret);
//! `fmt` prints the canonical form that `SHOW`-style output uses. `show` is the one
//! online subcommand: it asks a node for the cluster's effective schemes.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};

#[derive(Args, Debug)]
pub struct SchemeArgs {
    #[command(subcommand)]
    command: SchemeCommand,
}

#[derive(Subcommand, Debug)]
enum SchemeCommand {
    /// Check files of replication DDL; exit 1 if any has a problem.
    Check {
        /// Files to check; `-` reads standard input.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = CheckFormat::Text)]
        format: CheckFormat,
    },
    /// Print a file's statements in canonical form.
    Fmt {
        /// File to format; `-` reads standard input.
        file: PathBuf,
    },
    /// Print the cluster's effective schemes (after every ALTER and failover) as
    /// canonical CREATE REPLICATION statements, as the node asked has applied them.
    Show {
        /// Node to ask.
        #[arg(long, env = "HAWSER_HOST", default_value = "127.0.0.1:7420")]
        host: String,
        /// Only this scheme ([owner.]name); all schemes when left out.
        name: Option<String>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum CheckFormat {
    /// Compiler-style lines for people and editors.
    Text,
    /// One JSON object per file, one per line.
    Json,
}

fn read_input(path: &PathBuf) -> anyhow::Result<(String, String)> {
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .context("read standard input")?;
        Ok(("-".into(), s))
    } else {
        let s =
            std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        Ok((path.display().to_string(), s))
    }
}

pub async fn run(args: SchemeArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        SchemeCommand::Check { files, format } => {
            let mut ok = true;
            for path in &files {
                let (name, source) = read_input(path)?;
                let report = hawser_scheme::check_source(&name, &source);
                ok &= report.is_ok();
                match format {
                    CheckFormat::Text if report.is_ok() => println!("{}", report.summary()),
                    CheckFormat::Text => eprint!("{}", report.render_text()),
                    CheckFormat::Json => println!("{}", report.to_json()),
                }
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        SchemeCommand::Show { host, name } => {
            let mut client = hawser_client::Client::connect(&host)
                .await
                .with_context(|| format!("connect to {host}"))?;
            let reply = client
                .show_schemes(name.as_deref())
                .await
                .with_context(|| format!("schemes of {host}"))?;
            for s in &reply.schemes {
                println!("-- {} (version {})", s.name, s.version);
                print!("{}", s.ddl);
                if !s.ddl.ends_with('\n') {
                    println!();
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        SchemeCommand::Fmt { file } => {
            let (name, source) = read_input(&file)?;
            match hawser_scheme::format_source(&source) {
                Ok(text) => {
                    print!("{text}");
                    Ok(ExitCode::SUCCESS)
                }
                Err(mut report) => {
                    report.file = name;
                    eprint!("{}", report.render_text());
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}
