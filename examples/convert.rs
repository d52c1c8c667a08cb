//! Round a tensor to a few formats and print the results:
//! `cargo run --release --example convert`.

use anyhow::Result;
use candle_core::{Device, Tensor};
use qcandle::{pack, quantize, unpack, Format, Quant, Rounding};

fn main() -> Result<()> {
    let x = Tensor::new(&[0.1f32, -1.7, 2.6, 300.0, 1e-4], &Device::Cpu)?;
    println!("x              = {:?}", x.to_vec1::<f32>()?);
    for name in [
        "posit<8,0>",
        "posit<16,1>",
        "e4m3",
        "bf16",
        "fixed<8,4>",
        "block<8>",
    ] {
        let q = Quant::new(name.parse()?);
        println!("{name:<14} = {:?}", quantize(&x, &q)?.to_vec1::<f32>()?);
    }
    // Stochastic rounding: reproducible from the seed, a new stream per call.
    let q = Quant::new("e4m3".parse()?)
        .with_rounding(Rounding::Stochastic { bits: 23 })
        .with_seed(7);
    println!(
        "e4m3 stochastic = {:?}",
        quantize(&x, &q)?.to_vec1::<f32>()?
    );
    // Bit patterns: posit<8,0> packs to u8.
    let format: Format = "posit<8,0>".parse()?;
    let bits = pack(&x, &format)?;
    println!("posit<8,0> bits = {:?}", bits.to_vec1::<u8>()?);
    println!(
        "unpacked        = {:?}",
        unpack(&bits, &format)?.to_vec1::<f32>()?
    );
    Ok(())
}
