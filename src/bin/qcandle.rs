//! `qcandle`: the command-line tool. Thin: every subcommand composes library functions.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

use qcandle::io::{read_tensors, write_tensors};
use qcandle::{quantize, Format, Quant, Rounding};

#[derive(Parser)]
#[command(
    name = "qcandle",
    version,
    about = "Low-precision arithmetic simulation on candle"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Table of every preset format: bits, range, epsilon.
    Formats,
    /// Round every float tensor of an .npy or .safetensors file to a format.
    Quantize {
        /// Target format: posit<8,0>, float<5,2>, fixed<8,4>, block<8>, e4m3, bf16, ...
        #[arg(long)]
        format: Format,
        /// nearest-even, nearest-away, toward-zero, stochastic, stochastic:<bits>.
        #[arg(long, default_value = "nearest-even")]
        rounding: Rounding,
        /// Seed of the stochastic-rounding stream.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Input file (.npy or .safetensors).
        input: PathBuf,
        /// Output file (.npy or .safetensors), written atomically.
        output: PathBuf,
    },
    /// Round a normal sample to every preset and print the error statistics.
    Demo {
        /// Number of samples.
        #[arg(long, default_value_t = 1 << 20)]
        samples: usize,
        /// Seed of the sample and of stochastic rounding.
        #[arg(long, default_value_t = 0)]
        seed: u64,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Formats => print!("{}", qcandle::report::formats_table()),
        Command::Quantize {
            format,
            rounding,
            seed,
            input,
            output,
        } => {
            let q = Quant::new(format).with_rounding(rounding).with_seed(seed);
            let tensors = read_tensors(&input)?;
            let mut out = Vec::with_capacity(tensors.len());
            let mut rounded = 0;
            for (name, t) in tensors {
                let t = if t.dtype().is_float() {
                    rounded += 1;
                    quantize(&t, &q).with_context(|| format!("tensor {name}"))?
                } else {
                    t
                };
                out.push((name, t));
            }
            write_tensors(&output, &out)?;
            println!(
                "{}: {rounded} of {} tensors rounded to {format} ({rounding}) -> {}",
                input.display(),
                out.len(),
                output.display()
            );
        }
        Command::Demo { samples, seed } => {
            print!("{}", qcandle::report::demo_report(samples, seed)?)
        }
    }
    Ok(())
}
