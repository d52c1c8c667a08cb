//! The LNS proposal's MNIST experiment: a 784-100-10 MLP (ReLU, softmax cross-entropy),
//! batch 128, plain SGD at lr 0.1, normal initial weights (standard deviation 0.1, biases
//! too), 7 epochs, test accuracy after each epoch; either every GEMM in LNS arithmetic or
//! float32.
//!
//! `--arith lns` rounds every category of every layer (weight, activation, error, gradient)
//! to lns<32,23> and computes both layers' three GEMMs (forward, input gradient, weight and
//! bias gradients) with `accumulate = "lns:ideal"`: exact products, correctly rounded sums,
//! `k` ascending, bias last (`qcandle::quire::accumulate`). Softmax, the cross-entropy loss
//! and the SGD update `w - lr g` are f32, the update rounded back to lns<32,23>. `--arith
//! f32` is the same network and recipe in float32 (candle's matmul).
//!
//! Images are the pixels divided by 255 (in `[0, 1]`; qcandle's datasets hold `[-1, 1]`,
//! mapped back here). The batch order is `qcandle::data::permutation(60000, seed, epoch)`,
//! the initial weights `qcandle::report::normal_samples` of seeds derived from `--seed`; the
//! last batch of an epoch has 96 images.
//!
//! Run: `cargo run --release --example lns_mlp -- --data-dir ../shared/data/mnist --arith lns
//! --seed 0` (also `--epochs N`, `--train-limit N`). Prints one CSV line per epoch:
//! `epoch,test_accuracy,train_loss,train_seconds,test_seconds`.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Module, Tensor, D};
use candle_nn::{VarBuilder, VarMap};
use qcandle::data::{load, permutation, DatasetName};
use qcandle::nn::{round_vars_in_place, Mlp, QConfig};
use qcandle::optim::{LpSgd, SgdParams};

/// The standard deviation of the initial weights and biases.
const INIT_STD: f32 = 0.1;

/// The LNS config: every category in lns<32,23>, every GEMM in ideal LNS arithmetic.
const LNS_CONFIG: &str = r#"
weight = "lns<32,23>"
activation = "lns<32,23>"
error = "lns<32,23>"
gradient = "lns<32,23>"
accumulate = "lns:ideal"
"#;

struct Args {
    data_dir: PathBuf,
    lns: bool,
    seed: u64,
    epochs: usize,
    train_limit: Option<usize>,
}

fn args() -> Result<Args> {
    let mut a = Args {
        data_dir: PathBuf::from("../shared/data/mnist"),
        lns: true,
        seed: 0,
        epochs: 7,
        train_limit: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--data-dir" => a.data_dir = value()?.into(),
            "--arith" => {
                a.lns = match value()?.as_str() {
                    "lns" => true,
                    "f32" => false,
                    other => bail!("--arith takes lns or f32, got {other}"),
                }
            }
            "--seed" => a.seed = value()?.parse().context("--seed")?,
            "--epochs" => a.epochs = value()?.parse().context("--epochs")?,
            "--train-limit" => a.train_limit = Some(value()?.parse().context("--train-limit")?),
            other => bail!("unknown flag {other} (flags: --data-dir, --arith, --seed, --epochs, --train-limit)"),
        }
    }
    Ok(a)
}

/// Images `(N, 1, 28, 28)` in `[-1, 1]` as rows `(N, 784)` in `[0, 1]`.
fn rows(images: &Tensor) -> Result<Tensor> {
    let n = images.dim(0)?;
    Ok(images.reshape((n, 784))?.affine(0.5, 0.5)?)
}

/// Sets every variable to normal samples of standard deviation [`INIT_STD`], a stream per
/// variable (sorted names, seeds `seed * 16 + i`).
fn init_normal(varmap: &VarMap, seed: u64) -> Result<()> {
    let data = varmap
        .data()
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned var map"))?;
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for (i, name) in names.into_iter().enumerate() {
        let var = &data[name];
        let values: Vec<f32> =
            qcandle::report::normal_samples(var.elem_count(), seed * 16 + i as u64)
                .into_iter()
                .map(|x| x * INIT_STD)
                .collect();
        var.set(&Tensor::from_vec(values, var.shape(), var.device())?)?;
    }
    Ok(())
}

fn accuracy(model: &Mlp, images: &Tensor, labels: &Tensor) -> Result<f64> {
    let n = images.dim(0)?;
    let mut correct = 0u64;
    let mut start = 0;
    while start < n {
        let len = 1000.min(n - start);
        let logits = model.forward(&images.narrow(0, start, len)?)?;
        let predicted = logits.argmax(D::Minus1)?;
        let hits = predicted
            .eq(&labels.narrow(0, start, len)?)?
            .to_dtype(DType::U32)?
            .sum_all()?
            .to_scalar::<u32>()?;
        correct += u64::from(hits);
        start += len;
    }
    Ok(correct as f64 / n as f64)
}

fn main() -> Result<()> {
    let a = args()?;
    let data = load(DatasetName::Mnist, Some(&a.data_dir))?;
    let mut train_x = rows(&data.train_images)?;
    let mut train_y = data.train_labels.clone();
    if let Some(limit) = a.train_limit {
        let limit = limit.min(train_x.dim(0)?);
        train_x = train_x.narrow(0, 0, limit)?;
        train_y = train_y.narrow(0, 0, limit)?;
    }
    let test_x = rows(&data.test_images)?;
    let test_y = data.test_labels.clone();
    let config = if a.lns {
        QConfig::from_toml(LNS_CONFIG)?
    } else {
        QConfig::float32()
    };
    let device = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = Mlp::new(&[784, 100, 10], vb, &config)?;
    init_normal(&varmap, a.seed)?;
    round_vars_in_place(&varmap, &config)?;
    let params = config.param_quants(&varmap)?;
    let mut sgd = LpSgd::new(
        params,
        SgdParams {
            lr: 0.1,
            ..Default::default()
        },
    )?;
    let n = train_x.dim(0)?;
    println!("epoch,test_accuracy,train_loss,train_seconds,test_seconds");
    for epoch in 1..=a.epochs {
        let start = Instant::now();
        let order = permutation(n, a.seed, epoch);
        let mut loss_sum = 0.0;
        let mut batches = 0;
        for chunk in order.chunks(128) {
            let idx = Tensor::from_slice(chunk, chunk.len(), &device)?;
            let x = train_x.index_select(&idx, 0)?;
            let y = train_y.index_select(&idx, 0)?;
            let loss = candle_nn::loss::cross_entropy(&model.forward(&x)?, &y)?;
            sgd.backward_step(&loss)?;
            let l = f64::from(loss.to_scalar::<f32>()?);
            if !l.is_finite() {
                bail!("epoch {epoch}: the training loss is {l}");
            }
            loss_sum += l;
            batches += 1;
        }
        let train_s = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let acc = accuracy(&model, &test_x, &test_y)?;
        let test_s = start.elapsed().as_secs_f64();
        println!(
            "{epoch},{acc:.4},{:.5},{train_s:.2},{test_s:.2}",
            loss_sum / batches as f64
        );
    }
    Ok(())
}
