//! A plain candle transformer: the zoo's `transformer` (two pre-norm blocks of width 128
//! with 4 attention heads, an MLP of 512 with GELU, learned positions, the last position's
//! logits) written with candle-nn's modules, trained for a few steps on modular addition
//! (`a + b mod 97` from the sequence `a b =`): `cargo run --release --example transformer`.
//! `transformer_q.rs` is the same program with every category rounded, `transformer_eval.rs`
//! evaluates this model from a model file; `tests/examples_diff.rs` counts the lines that
//! differ. The model's items are public for the evaluation program and the tests.

use anyhow::Result;
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{AdamW, Embedding, LayerNorm, Linear, Optimizer, ParamsAdamW, VarBuilder, VarMap};

/// The modulus: tokens `0..P` and `=` (P), answers `0..P`.
pub const P: usize = 97;
const SEQ: usize = 3;
const WIDTH: usize = 128;
const HEADS: usize = 4;
const MLP: usize = 512;
const BLOCKS: usize = 2;

struct Block {
    ln1: LayerNorm,
    qkv: Linear,
    proj: Linear,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

impl Block {
    fn new(vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            ln1: candle_nn::layer_norm(WIDTH, 1e-5, vb.pp("ln1"))?,
            qkv: candle_nn::linear(WIDTH, 3 * WIDTH, vb.pp("qkv"))?,
            proj: candle_nn::linear(WIDTH, WIDTH, vb.pp("proj"))?,
            ln2: candle_nn::layer_norm(WIDTH, 1e-5, vb.pp("ln2"))?,
            fc1: candle_nn::linear(WIDTH, MLP, vb.pp("fc1"))?,
            fc2: candle_nn::linear(MLP, WIDTH, vb.pp("fc2"))?,
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
        let scores = q.contiguous()?.matmul(&k.t()?.contiguous()?)?;
        let scores = (scores * (1.0 / (hd as f64).sqrt()))?;
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let mixed = weights.matmul(&v.contiguous()?)?;
        let mixed = mixed.transpose(1, 2)?.reshape((n, t, d))?;
        let x = (x + mixed.apply(&self.proj)?)?;
        let h = x
            .apply(&self.ln2)?
            .apply(&self.fc1)?
            .gelu_erf()?
            .apply(&self.fc2)?;
        Ok((x + h)?)
    }
}

/// The transformer: token ids `(N, 3)` to logits `(N, P)`.
pub struct Transformer {
    embed: Embedding,
    pos: Embedding,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
}

impl Transformer {
    /// The model's variables under `vb`.
    pub fn new(vb: VarBuilder) -> Result<Self> {
        let blocks = (0..BLOCKS)
            .map(|b| Block::new(vb.pp(format!("block{b}"))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            embed: candle_nn::embedding(P + 1, WIDTH, vb.pp("embed"))?,
            pos: candle_nn::embedding(SEQ, WIDTH, vb.pp("pos"))?,
            blocks,
            ln_f: candle_nn::layer_norm(WIDTH, 1e-5, vb.pp("ln_f"))?,
            head: candle_nn::linear(WIDTH, P, vb.pp("head"))?,
        })
    }

    /// Logits of the last position.
    pub fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let t = tokens.dim(1)?;
        let positions = Tensor::arange(0u32, t as u32, tokens.device())?;
        let (e, p) = (self.embed.forward(tokens)?, self.pos.forward(&positions)?);
        let mut x = e.broadcast_add(&p)?;
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
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
    let model = Transformer::new(vb)?;
    let params = ParamsAdamW {
        lr: 3e-3,
        ..Default::default()
    };
    let mut opt = AdamW::new(varmap.all_vars(), params)?;
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
