//! A small pre-norm transformer encoder built from the quantized blocks, for sequence
//! classification (the `transformer` model of the zoo, trained on modular
//! addition, `--data modadd`).
//!
//! For tokens `t` of shape (N, T):
//!
//! ```text
//! x = Q(embed[t] + pos[0..T])
//! for each block:  x = Q(x + proj(attention(ln1(x))))
//!                  x = Q(x + fc2(gelu(fc1(ln2(x)))))
//! logits = head(ln_f(x[:, T-1]))
//! attention(h) = mix(softmax(scores(q, kᵀ) / sqrt(d_head)), v),  (q, k, v) = qkv(h) split in heads
//! ```
//!
//! Every layer is a quantized block: linear layers are [`QLinear`], the two matrix products of
//! attention are [`QMatMul`] (operands, product and errors rounded; both summed per the
//! layer's `accumulate` setting, as the linear layers are), softmax and GELU are
//! [`QActivation`]s, the norms [`QLayerNorm`]s, and each residual sum is a [`QAdd`] with its
//! own quantizer, since the sum of two values on a grid is off it. The attention scale is applied in f32
//! before the softmax (as a fused softmax kernel would). No causal mask: the model reads the
//! last position, which sees the whole sequence.
//!
//! Layer names (what config `[[layer]]` patterns match): `embed`, `pos`, `embed_sum`, then
//! per block `b` `block{b}.ln1`, `block{b}.qkv`, `block{b}.scores`, `block{b}.softmax`,
//! `block{b}.mix`, `block{b}.proj`, `block{b}.res1`, `block{b}.ln2`, `block{b}.fc1`,
//! `block{b}.gelu`, `block{b}.fc2`, `block{b}.res2`, and finally `ln_f` and `head`.

use candle_core::{DType, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

use crate::nn::blocks::{
    Activation, NormStats, QActivation, QAdd, QEmbedding, QLayerNorm, QMatMul,
};
use crate::nn::config::QConfig;
use crate::nn::layers::QLinear;
use crate::ops::Quant;

/// The modulus of the modular-addition task the zoo's transformer is sized for: tokens
/// `0..97` and `=` (97), answers `0..97`.
pub const MODADD_P: usize = 97;

/// The sizes of a [`Transformer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransformerConfig {
    /// Number of token ids.
    pub vocab: usize,
    /// Number of output classes.
    pub classes: usize,
    /// Sequence length.
    pub seq_len: usize,
    /// Width of the residual stream.
    pub width: usize,
    /// Attention heads (must divide `width`).
    pub heads: usize,
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden width of each block's MLP.
    pub mlp: usize,
    /// How the layer norms compute their statistics.
    pub norm_stats: NormStats,
}

impl Default for TransformerConfig {
    /// The zoo's `transformer`: modular addition mod 97 (98 tokens with `=`, 97 classes,
    /// sequences of 3), 2 blocks of width 128 with 4 heads and an MLP of 512.
    fn default() -> Self {
        TransformerConfig {
            vocab: MODADD_P + 1,
            classes: MODADD_P,
            seq_len: 3,
            width: 128,
            heads: 4,
            layers: 2,
            mlp: 512,
            norm_stats: NormStats::F32,
        }
    }
}

/// One pre-norm block: attention and MLP, each added to the residual stream.
#[derive(Debug, Clone)]
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
    fn new(c: &TransformerConfig, b: usize, vb: &VarBuilder, config: &QConfig) -> Result<Self> {
        let name = |s: &str| format!("block{b}.{s}");
        let vb = |s: &str| vb.pp(name(s));
        let d = c.width;
        let ln = |s: &str| QLayerNorm::new(d, 1e-5, c.norm_stats, vb(s), config);
        Ok(Block {
            ln1: ln("ln1")?,
            qkv: QLinear::new(d, 3 * d, vb("qkv"), config)?,
            scores: QMatMul::new(&name("scores"), config)?,
            softmax: QActivation::new(&name("softmax"), Activation::Softmax, config),
            mix: QMatMul::new(&name("mix"), config)?,
            proj: QLinear::new(d, d, vb("proj"), config)?,
            res1: QAdd::new(&name("res1"), config),
            ln2: ln("ln2")?,
            fc1: QLinear::new(d, c.mlp, vb("fc1"), config)?,
            gelu: QActivation::new(&name("gelu"), Activation::Gelu, config),
            fc2: QLinear::new(c.mlp, d, vb("fc2"), config)?,
            res2: QAdd::new(&name("res2"), config),
        })
    }

    fn forward(&self, x: &Tensor, heads: usize) -> Result<Tensor> {
        let (n, t, d) = x.dims3()?;
        let hd = d / heads;
        let qkv = self.qkv.forward(&self.ln1.forward(x)?)?;
        // (N, T, 3, H, hd) -> (3, N, H, T, hd)
        let qkv = qkv
            .reshape((n, t, 3, heads, hd))?
            .permute((2, 0, 3, 1, 4))?;
        let (q, k, v) = (qkv.get(0)?, qkv.get(1)?, qkv.get(2)?);
        let scores = self
            .scores
            .forward(&q, &k.transpose(D::Minus2, D::Minus1)?)?;
        let weights = self
            .softmax
            .forward(&(scores * (1.0 / (hd as f64).sqrt()))?)?;
        let mixed = self.mix.forward(&weights, &v)?; // (N, H, T, hd)
        let mixed = mixed.transpose(1, 2)?.reshape((n, t, d))?;
        let x = self.res1.forward(x, &self.proj.forward(&mixed)?)?;
        let h = self.fc1.forward(&self.ln2.forward(&x)?)?;
        let h = self.fc2.forward(&self.gelu.forward(&h)?)?;
        self.res2.forward(&x, &h)
    }

    fn quants(&self) -> Vec<Quant> {
        let mut quants = self.ln1.quants();
        quants.extend(self.qkv.quants());
        quants.extend(self.scores.quants());
        quants.extend(self.softmax.quants());
        quants.extend(self.mix.quants());
        quants.extend(self.proj.quants());
        quants.extend(self.res1.quants());
        quants.extend(self.ln2.quants());
        quants.extend(self.fc1.quants());
        quants.extend(self.gelu.quants());
        quants.extend(self.fc2.quants());
        quants.extend(self.res2.quants());
        quants
    }
}

/// A pre-norm transformer encoder classifying token sequences by their last position (see
/// the module docs).
#[derive(Debug, Clone)]
pub struct Transformer {
    sizes: TransformerConfig,
    embed: QEmbedding,
    pos: QEmbedding,
    embed_sum: QAdd,
    blocks: Vec<Block>,
    ln_f: QLayerNorm,
    head: QLinear,
}

impl Transformer {
    /// The model's variables under `vb`, quantized per `config`. Sizes that do not fit
    /// together (a width the heads do not divide, a zero size) are an error.
    pub fn new(sizes: TransformerConfig, vb: VarBuilder, config: &QConfig) -> Result<Self> {
        let c = sizes;
        let all = [
            c.vocab, c.classes, c.seq_len, c.width, c.heads, c.layers, c.mlp,
        ];
        if all.contains(&0) || !c.width.is_multiple_of(c.heads) {
            candle_core::bail!(
                "transformer: every size must be >= 1 and the heads must divide the width, got \
                 {c:?}"
            );
        }
        let blocks = (0..c.layers)
            .map(|b| Block::new(&c, b, &vb, config))
            .collect::<Result<Vec<_>>>()?;
        Ok(Transformer {
            sizes,
            embed: QEmbedding::new(c.vocab, c.width, vb.pp("embed"), config)?,
            pos: QEmbedding::new(c.seq_len, c.width, vb.pp("pos"), config)?,
            embed_sum: QAdd::new("embed_sum", config),
            blocks,
            ln_f: QLayerNorm::new(c.width, 1e-5, c.norm_stats, vb.pp("ln_f"), config)?,
            head: QLinear::new(c.width, c.classes, vb.pp("head"), config)?,
        })
    }

    /// The model's sizes.
    pub fn sizes(&self) -> &TransformerConfig {
        &self.sizes
    }

    /// Every quantizer of the model (clones sharing their call counters).
    pub fn quants(&self) -> Vec<Quant> {
        let mut quants = self.embed.quants();
        quants.extend(self.pos.quants());
        quants.extend(self.embed_sum.quants());
        for b in &self.blocks {
            quants.extend(b.quants());
        }
        quants.extend(self.ln_f.quants());
        quants.extend(self.head.quants());
        quants
    }
}

impl Module for Transformer {
    /// Logits `(N, classes)` of token ids `(N, T)`, given as integers or as floats holding
    /// integers (the zoo's datasets hold tokens as f32 `(N, 1, 1, T)`, which is accepted too).
    fn forward(&self, tokens: &Tensor) -> Result<Tensor> {
        let t = self.sizes.seq_len;
        let tokens = match tokens.dims() {
            [n, 1, 1, len] | [n, len] if *len == t => tokens.reshape((*n, t))?,
            dims => candle_core::bail!(
                "transformer: needs token ids of shape (N, {t}) or (N, 1, 1, {t}), got {dims:?}"
            ),
        };
        let ids = match tokens.dtype() {
            DType::U8 | DType::U32 | DType::I64 => tokens,
            _ => {
                let v = tokens.to_dtype(DType::F64)?;
                let whole = (v.floor()? - &v)?.abs()?.max_all()?.to_scalar::<f64>()? == 0.0;
                if !whole {
                    candle_core::bail!("transformer: token ids must be whole numbers");
                }
                let neg = v.min_all()?.to_scalar::<f64>()? < 0.0;
                if neg {
                    candle_core::bail!("transformer: token ids must be >= 0");
                }
                v.to_dtype(DType::U32)?
            }
        };
        let positions = Tensor::arange(0u32, t as u32, ids.device())?;
        let (e, p) = (self.embed.forward(&ids)?, self.pos.forward(&positions)?);
        let mut x = self.embed_sum.forward(&e, &p)?;
        for b in &self.blocks {
            x = b.forward(&x, self.sizes.heads)?;
        }
        let last = x.narrow(1, t - 1, 1)?.squeeze(1)?;
        self.head.forward(&self.ln_f.forward(&last)?)
    }
}
