//! The ConvNet of `convnet.rs` evaluated from a model file (here one written with random
//! weights, standing for a trained model): `cargo run --release --example convnet_eval`.
//! `convnet_eval_q.rs` is the same program with weight-only post-training quantization;
//! `tests/examples_diff.rs` counts the lines that differ.

use anyhow::Result;
use candle_core::{DType, Device, ModuleT, Tensor};
use candle_nn::{Conv2d, Dropout, Linear, VarBuilder, VarMap};

const LABELS: usize = 10;

struct ConvNet {
    conv1: Conv2d,
    conv2: Conv2d,
    fc1: Linear,
    fc2: Linear,
    dropout: Dropout,
}

impl ConvNet {
    fn new(vb: VarBuilder) -> Result<Self> {
        let conv1 = candle_nn::conv2d(1, 32, 5, Default::default(), vb.pp("c1"))?;
        let conv2 = candle_nn::conv2d(32, 64, 5, Default::default(), vb.pp("c2"))?;
        let fc1 = candle_nn::linear(1024, 1024, vb.pp("fc1"))?;
        let fc2 = candle_nn::linear(1024, LABELS, vb.pp("fc2"))?;
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
    let path = std::env::temp_dir().join("qcandle-example-convnet.safetensors");
    let varmap = VarMap::new();
    ConvNet::new(VarBuilder::from_varmap(&varmap, DType::F32, &device))?;
    varmap.save(&path)?;

    let tensors = candle_core::safetensors::load(&path, &device)?;
    let vb = VarBuilder::from_tensors(tensors, DType::F32, &device);
    let model = ConvNet::new(vb)?;
    let images = Tensor::randn(0f32, 1.0, (8, 784), &device)?;
    let logits = model.forward(&images, false)?;
    println!("predicted classes: {}", logits.argmax(1)?);
    Ok(())
}
