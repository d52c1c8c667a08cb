//! `convnet.rs` converted to low precision in every category (weights, activations, errors,
//! gradients and optimizer state, per the config): `cargo run --release --example
//! convnet_q`. `tests/examples_diff.rs` counts the lines that differ from `convnet.rs`.

use anyhow::Result;
use candle_core::{DType, Device, ModuleT, Tensor};
use candle_nn::{AdamW, Dropout, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use qcandle::nn::{QConfig, QConv2d, QLinear};
use qcandle::optim::OptimLp;

const LABELS: usize = 10;

struct ConvNet {
    conv1: QConv2d,
    conv2: QConv2d,
    fc1: QLinear,
    fc2: QLinear,
    dropout: Dropout,
}

impl ConvNet {
    fn new(vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let conv1 = QConv2d::new(1, 32, 5, Default::default(), vb.pp("c1"), config)?;
        let conv2 = QConv2d::new(32, 64, 5, Default::default(), vb.pp("c2"), config)?;
        let fc1 = QLinear::new(1024, 1024, vb.pp("fc1"), config)?;
        let fc2 = QLinear::new(1024, LABELS, vb.pp("fc2"), config)?;
        let dropout = Dropout::new(0.5);
        Ok(Self {
            conv1,
            conv2,
            fc1,
            fc2,
            dropout,
        })
    }

    fn forward(&self, xs: &Tensor, train: bool) -> Result<Tensor> {
        let b = xs.dim(0)?;
        let xs = xs
            .reshape((b, 1, 28, 28))?
            .apply(&self.conv1)?
            .max_pool2d(2)?
            .apply(&self.conv2)?
            .max_pool2d(2)?
            .flatten_from(1)?
            .apply(&self.fc1)?
            .relu()?;
        Ok(self.dropout.forward_t(&xs, train)?.apply(&self.fc2)?)
    }
}

fn main() -> Result<()> {
    let device = Device::Cpu;
    let config = QConfig::load("posit<16,1>")?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = ConvNet::new(vb, &config)?;
    let params = ParamsAdamW {
        lr: 1e-3,
        ..Default::default()
    };
    let quants = config.param_quants(&varmap)?;
    let mut opt = OptimLp::new(AdamW::new(varmap.all_vars(), params)?, quants)?;
    // Synthetic data: 64 random images, labels 0..9 in turn.
    let images = Tensor::randn(0f32, 1.0, (64, 784), &device)?;
    let labels: Vec<u32> = (0..64).map(|i| i % LABELS as u32).collect();
    let labels = Tensor::new(labels, &device)?;
    for step in 1..=5 {
        let logits = model.forward(&images, true)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &labels)?;
        opt.backward_step(&loss)?;
        println!("step {step}: loss {:.4}", loss.to_scalar::<f32>()?);
    }
    let logits = model.forward(&images, false)?;
    println!("logits of the first image: {}", logits.get(0)?);
    Ok(())
}
