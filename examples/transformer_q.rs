//! `transformer.rs` converted to low precision in every category (weights, activations,
//! errors, gradients and optimizer state, per the config): the zoo's `transformer` written
//! with candle-nn's structure and qcandle's quantized blocks, `cargo run --release --example
//! transformer_q`. `tests/examples_diff.rs` counts the lines that differ from
//! `transformer.rs` and checks that this model computes the zoo's bits.

use anyhow::Result;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, VarBuilder, VarMap};
use qcandle::nn::{QActivation, QAdd, QConfig, QEmbedding, QLayerNorm, QLinear, QMatMul};
use qcandle::optim::OptimLp;

/// The modulus: tokens `0..P` and `=` (P), answers `0..P`.
pub const P: usize = 97;
const SEQ: usize = 3;
const WIDTH: usize = 128;
const HEADS: usize = 4;
const MLP: usize = 512;
const BLOCKS: usize = 2;

struct Block {
    ln1: QLayerNorm,
    qkv: QLinear,
    scores: QMatMul,
    softmax: QActivation,
    mix: QMatMul,
    proj: QLinear,
    res1: QAdd,
    ln2: QLayerNorm,
    fc1: QLinear,
    gelu: QActivation,
    fc2: QLinear,
    res2: QAdd,
}

impl Block {
    fn new(vb: VarBuilder, config: &QConfig) -> Result<Self> {
        Ok(Self {
            ln1: qcandle::nn::layer_norm(WIDTH, 1e-5, vb.pp("ln1"), config)?,
            qkv: qcandle::nn::linear(WIDTH, 3 * WIDTH, vb.pp("qkv"), config)?,
            scores: qcandle::nn::matmul(vb.pp("scores"), config)?,
            softmax: qcandle::nn::softmax_last_dim(vb.pp("softmax"), config),
            mix: qcandle::nn::matmul(vb.pp("mix"), config)?,
            proj: qcandle::nn::linear(WIDTH, WIDTH, vb.pp("proj"), config)?,
            res1: qcandle::nn::add(vb.pp("res1"), config),
            ln2: qcandle::nn::layer_norm(WIDTH, 1e-5, vb.pp("ln2"), config)?,
            fc1: qcandle::nn::linear(WIDTH, MLP, vb.pp("fc1"), config)?,
            gelu: qcandle::nn::gelu_erf(vb.pp("gelu"), config),
            fc2: qcandle::nn::linear(MLP, WIDTH, vb.pp("fc2"), config)?,
            res2: qcandle::nn::add(vb.pp("res2"), config),
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (n, t, d) = x.dims3()?;
        let hd = d / HEADS;
        // (N, T, 3 D) -> (3, N, H, T, hd): queries, keys and values of each head
        let qkv = x.apply(&self.ln1)?.apply(&self.qkv)?;
        let qkv = qkv
            .reshape((n, t, 3, HEADS, hd))?
            .permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
        let scores = self.scores.forward(&q, &k.t()?)?;
        let scores = (scores * (1.0 / (hd as f64).sqrt()))?;
        let weights = scores.apply(&self.softmax)?;
        let mixed = self.mix.forward(&weights, &v)?;
        let mixed = mixed.transpose(1, 2)?.reshape((n, t, d))?;
        let x = self.res1.forward(x, &mixed.apply(&self.proj)?)?;
        let h = x
            .apply(&self.ln2)?
            .apply(&self.fc1)?
            .apply(&self.gelu)?
            .apply(&self.fc2)?;
        Ok(self.res2.forward(&x, &h)?)
    }
}

/// The transformer: token ids `(N, 3)` to logits `(N, P)`.
pub struct Transformer {
    embed: QEmbedding,
    pos: QEmbedding,
    embed_sum: QAdd,
    blocks: Vec<Block>,
    ln_f: QLayerNorm,
    head: QLinear,
}

impl Transformer {
    /// The model's variables under `vb`.
    pub fn new(vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let blocks = (0..BLOCKS)
            .map(|b| Block::new(vb.pp(format!("block{b}")), config))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed: qcandle::nn::embedding(P + 1, WIDTH, vb.pp("embed"), config)?,
            pos: qcandle::nn::embedding(SEQ, WIDTH, vb.pp("pos"), config)?,
            embed_sum: qcandle::nn::add(vb.pp("embed_sum"), config),
            blocks,
            ln_f: qcandle::nn::layer_norm(WIDTH, 1e-5, vb.pp("ln_f"), config)?,
            head: qcandle::nn::linear(WIDTH, P, vb.pp("head"), config)?,
        })
    }

    /// Logits of the last position.
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let t = tokens.dim(1)?;
        let positions = Tensor::arange(0u32, t as u32, tokens.device())?;
        let (e, p) = (self.embed.forward(tokens)?, self.pos.forward(&positions)?);
        let mut x = self.embed_sum.forward(&e, &p)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        let last = x.narrow(1, t - 1, 1)?.squeeze(1)?;
        Ok(last.apply(&self.ln_f)?.apply(&self.head)?)
    }
}

/// `n` sequences `a b =` (token ids, `(n, 3)`) and their sums `a + b mod P`.
pub fn modadd_batch(n: usize, device: &Device) -> Result<(Tensor, Tensor)> {
    let pairs: Vec<(u32, u32)> = (0..n as u32)
        .map(|i| (i % P as u32, i * 31 % P as u32))
        .collect();
    let tokens: Vec<u32> = pairs.iter().flat_map(|&(a, b)| [a, b, P as u32]).collect();
    let sums: Vec<u32> = pairs.iter().map(|&(a, b)| (a + b) % P as u32).collect();
    let tokens = Tensor::from_vec(tokens, (n, SEQ), device)?;
    Ok((tokens, Tensor::new(sums, device)?))
}

/// Trains the model for 5 steps on 64 sequences and prints the loss.
pub fn main() -> Result<()> {
    let device = Device::Cpu;
    let config = QConfig::load("posit<16,1>")?;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = Transformer::new(vb, &config)?;
    let params = ParamsAdamW {
        lr: 3e-3,
        ..Default::default()
    };
    let quants = config.param_quants(&varmap)?;
    let mut opt = OptimLp::new(AdamW::new(varmap.all_vars(), params)?, quants)?;
    let (tokens, sums) = modadd_batch(64, &device)?;
    for step in 1..=5 {
        let logits = model.forward(&tokens)?;
        let loss = candle_nn::loss::cross_entropy(&logits, &sums)?;
        opt.backward_step(&loss)?;
        println!("step {step}: loss {:.4}", loss.to_scalar::<f32>()?);
    }
    let logits = model.forward(&tokens)?;
    println!("predicted sums: {}", logits.argmax(1)?.narrow(0, 0, 8)?);
    Ok(())
}
