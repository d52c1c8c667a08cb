//! Modular addition, a synthetic sequence task that ships with the code (`--data modadd`).
//!
//! Every pair `(a, b)` with `a, b` in `0..p` is one item: the tokens `[a, b, =]` (`=` is token
//! `p`) and the label `(a + b) mod p`. With `p` = [`MODADD_P`] = 97 there are 9409 items and
//! 97 classes, so chance accuracy is about 1%. The items are split once, by a Fisher–Yates
//! permutation from the fixed seed [`SPLIT_SEED`] ([`super::permutation`]): the first
//! [`TRAIN_PERCENT`]% of the permuted items train, the rest test. The split does not depend
//! on a run's seed, so every run (and every point of a sweep) sees the same data and the
//! dataset's digest is one value.
//!
//! Tokens are stored as f32 "images" `(N, 1, 1, 3)` (whole numbers, exact in f32) and labels
//! as `(N)` u32, so batching, shuffling and evaluation are those of the image datasets; the
//! transformer reads the three tokens back as ids.

use candle_core::{Device, Tensor};

use super::{permutation, DataError, Dataset, DatasetName};
pub use crate::nn::MODADD_P;

/// The seed of the fixed train/test split.
pub const SPLIT_SEED: u64 = 97;

/// The share of the items that train, in percent.
pub const TRAIN_PERCENT: usize = 80;

/// The modular-addition dataset mod `p` (2 <= `p` <= [`MODADD_P`], so the zoo's transformer,
/// sized for 97, reads any of them). Its `source` is `modadd`.
pub fn modadd(p: usize) -> Result<Dataset, DataError> {
    if !(2..=MODADD_P).contains(&p) {
        return Err(DataError::Tensor(candle_core::Error::Msg(format!(
            "modadd: the modulus must lie in 2..={MODADD_P}, got {p}"
        ))));
    }
    let n = p * p;
    let order = permutation(n, SPLIT_SEED, 0);
    let train_n = n * TRAIN_PERCENT / 100;
    let split = |ids: &[u32]| -> Result<(Tensor, Tensor), DataError> {
        let mut tokens = Vec::with_capacity(ids.len() * 3);
        let mut labels = Vec::with_capacity(ids.len());
        for &i in ids {
            let (a, b) = (i as usize / p, i as usize % p);
            tokens.extend([a as f32, b as f32, p as f32]);
            labels.push(((a + b) % p) as u32);
        }
        let m = ids.len();
        Ok((
            Tensor::from_vec(tokens, (m, 1, 1, 3), &Device::Cpu)?,
            Tensor::from_vec(labels, m, &Device::Cpu)?,
        ))
    };
    let (train_images, train_labels) = split(&order[..train_n])?;
    let (test_images, test_labels) = split(&order[train_n..])?;
    Ok(Dataset {
        name: DatasetName::ModAdd,
        train_images,
        train_labels,
        test_images,
        test_labels,
        source: "modadd".to_string(),
    })
}
