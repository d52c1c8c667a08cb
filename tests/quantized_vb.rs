//! Weight-only quantization of a plain candle-nn model through a rounding `VarBuilder`.

use std::collections::HashMap;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{VarBuilder, VarMap};
use qcandle::nn::{quantized_var_builder, QConfig};
use qcandle::{quantize_no_grad, Quant};

type R = anyhow::Result<()>;

/// A candle-nn model as a candle author writes it: two linear layers and a ReLU.
struct Net {
    fc1: candle_nn::Linear,
    fc2: candle_nn::Linear,
}

impl Net {
    fn new(vb: VarBuilder) -> candle_core::Result<Self> {
        Ok(Net {
            fc1: candle_nn::linear(6, 5, vb.pp("fc1"))?,
            fc2: candle_nn::linear(5, 3, vb.pp("fc2"))?,
        })
    }
}

impl Module for Net {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        self.fc2.forward(&self.fc1.forward(x)?.relu()?)
    }
}

/// Pretrained weights, as a file would hold them: the model's tensors (names and shapes
/// from its `VarMap`) filled with fixed values, so that the hidden units are live for the
/// test input (a random initialisation can leave every ReLU at zero, and then the output
/// is fc2's bias whatever fc1's weights are).
fn weights() -> anyhow::Result<HashMap<String, Tensor>> {
    let varmap = VarMap::new();
    Net::new(VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu))?;
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    names
        .into_iter()
        .enumerate()
        .map(|(t, name)| {
            let shape = data[name].as_tensor().shape().clone();
            let values: Vec<f32> = (0..shape.elem_count())
                .map(|i| 0.45 * (0.7 * i as f32 + 1.3 * t as f32 + 0.4).sin())
                .collect();
            Ok((name.clone(), Tensor::from_vec(values, shape, &Device::Cpu)?))
        })
        .collect()
}

fn load(tensors: &HashMap<String, Tensor>) -> VarBuilder<'static> {
    VarBuilder::from_tensors(tensors.clone(), DType::F32, &Device::Cpu)
}

#[test]
fn a_candle_model_loads_with_its_weights_rounded_per_layer() -> R {
    let tensors = weights()?;
    let config = QConfig::from_toml(
        "weight = \"posit<6,0>\"\n[[layer]]\npattern = \"fc2\"\nweight = \"none\"\n",
    )?;
    // The one changed line: the VarBuilder the model is built from.
    let net = Net::new(quantized_var_builder(load(&tensors), &config))?;
    let p6 = Quant::new("posit<6,0>".parse()?);
    let mut by_hand = tensors.clone();
    for name in ["fc1.weight", "fc1.bias"] {
        by_hand.insert(name.into(), quantize_no_grad(&tensors[name], &p6)?);
    }
    assert_ne!(
        by_hand["fc1.weight"].to_vec2::<f32>()?,
        tensors["fc1.weight"].to_vec2::<f32>()?,
        "posit<6,0> changes the weights"
    );
    let expected = Net::new(load(&by_hand))?;
    let plain = Net::new(load(&tensors))?;
    let x = Tensor::arange(0f32, 12.0, &Device::Cpu)?.reshape((2, 6))?;
    let x = (x / 7.0)?;
    let y = net.forward(&x)?.to_vec2::<f32>()?;
    assert_eq!(y, expected.forward(&x)?.to_vec2::<f32>()?);
    assert_ne!(y, plain.forward(&x)?.to_vec2::<f32>()?);
    // fc2 is excluded by the pattern: its weight is read unchanged.
    assert_eq!(
        net.fc2.weight().to_vec2::<f32>()?,
        tensors["fc2.weight"].to_vec2::<f32>()?
    );
    Ok(())
}

#[test]
fn a_missing_or_misshapen_tensor_is_an_error() -> R {
    let mut tensors = weights()?;
    let config = QConfig::load("posit<8,0>")?;
    tensors.remove("fc2.bias");
    let e = Net::new(quantized_var_builder(load(&tensors), &config)).err();
    assert!(e.is_some(), "a missing tensor is refused");
    let mut tensors = weights()?;
    tensors.insert(
        "fc1.weight".into(),
        Tensor::zeros((2, 2), DType::F32, &Device::Cpu)?,
    );
    let e = Net::new(quantized_var_builder(load(&tensors), &config)).err();
    assert!(e.is_some(), "a tensor of another shape is refused");
    Ok(())
}
