//! Tensors for the MX kernel with blocks along a non-last axis: every block (a column of up
//! to 32 rows) gets one kind of content, so that tiles mix ordinary blocks with zero, NaN
//! and Inf blocks, blocks of subnormal inputs, blocks whose maximum lies on, just below or
//! just above a power of two, and blocks of values on and next to element-grid ties.

use qcandle::format::mx::{MxElement, MxGrid};

/// The six OCP MX element formats by name, in the order of `MxElement::ALL`.
pub fn mx_names() -> [&'static str; 6] {
    MxElement::ALL.map(MxElement::name)
}

/// The shapes and block axes the strided tests use: 2-D and 3-D tensors along dims 0 and 1,
/// row counts that are not multiples of 32, column counts that are not multiples of 16 or
/// 8, column counts below, at and above the prefetch distance of 64 (so that tiles read
/// ahead within their slab, into the next slab, and past the data), and one tensor large
/// enough to be split over threads.
pub const STRIDED_SHAPES: [(&[usize], i64); 10] = [
    (&[70, 3, 21], 0),
    (&[2, 45, 17], 1),
    (&[33, 2, 16], 0),
    (&[3, 64, 40], 1),
    (&[3, 64, 40], -2),
    (&[40, 24], 0),
    (&[32, 9, 7], 0),
    (&[150, 2, 300], 0),
    (&[100, 64], 0),
    (&[45, 2, 40], 0),
];

/// A SplitMix64 step.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `2^e` as an f32 (`-149 <= e <= 127`).
fn pow2(e: i32) -> f32 {
    2f64.powi(e) as f32
}

/// A random f32 of magnitude below `2^e` (`e` at least -148), random sign.
fn below(state: &mut u64, e: i32) -> f32 {
    let r = mix(state);
    let shift = (r % 12) as i32 + 1;
    let v = pow2((e - shift).max(-149)) * (1.0 + ((r >> 8) & 0x7f_ffff) as f32 / 8388608.0);
    let v = v.min(f32::from_bits(pow2(e).to_bits() - 1));
    if r >> 63 == 1 {
        -v
    } else {
        v
    }
}

/// The tensor of shape `dims` with blocks along `dim`, from `seed`.
pub fn strided_tensor(dims: &[usize], dim: i64, seed: u64) -> Vec<f32> {
    let grid = MxGrid::new(32, dim, dims, "mx").unwrap();
    let n: usize = dims.iter().product();
    let mut state = seed;
    // Per block: its kind, a binade, and the row of its special element.
    let blocks: Vec<(u64, i32, usize)> = (0..grid.count())
        .map(|_| {
            let r = mix(&mut state);
            let kind = r % 11;
            let e = ((r >> 8) % 263) as i32 - 135;
            (kind, e.min(127), ((r >> 20) % 32) as usize)
        })
        .collect();
    (0..n)
        .map(|i| {
            let (kind, e, special) = blocks[grid.block_of(i)];
            let row = (i / grid.inner()) % grid.len() % 32;
            let r = mix(&mut state);
            let e_normal = e.clamp(-120, 120);
            match kind {
                // Ordinary values over a dozen binades.
                0 => below(&mut state, e_normal),
                // Zeros of both signs.
                1 => {
                    if r & 1 == 0 {
                        0.0
                    } else {
                        -0.0
                    }
                }
                // A NaN among ordinary values.
                2 if row == special => f32::from_bits(0x7fc0_0000 | (r as u32 & 0x803f_ffff)),
                // An infinity among ordinary values.
                3 if row == special => {
                    if r & 1 == 0 {
                        f32::INFINITY
                    } else {
                        f32::NEG_INFINITY
                    }
                }
                2 | 3 => below(&mut state, e_normal),
                // Subnormal inputs only.
                4 => f32::from_bits(r as u32 & 0x807f_ffff),
                // Maximum exactly 2^e, one f32 below it, one f32 above it.
                5..=7 if row == special => {
                    let bits = pow2(e.max(-149)).to_bits();
                    let bits = match kind {
                        5 => bits,
                        6 => bits - 1,
                        _ => bits + 1,
                    };
                    let v = f32::from_bits(bits);
                    if r & 1 == 0 {
                        v
                    } else {
                        -v
                    }
                }
                5..=7 => below(&mut state, e.max(-148)),
                // Subnormal inputs in a block of small normal values.
                8 => {
                    if r & 1 == 0 {
                        f32::from_bits(r as u32 & 0x807f_ffff)
                    } else {
                        below(&mut state, -100)
                    }
                }
                // Multiples of 2^(e - 5) (on and between the element grid's points, ties
                // included) and their f32 neighbours.
                9 => {
                    let v = ((r >> 8) % 64) as f32 * pow2(e_normal - 5);
                    let bits = v.to_bits();
                    let v = match (r >> 16) % 3 {
                        0 => v,
                        1 if bits > 0 => f32::from_bits(bits - 1),
                        _ => f32::from_bits(bits + 1),
                    };
                    if r >> 63 == 1 {
                        -v
                    } else {
                        v
                    }
                }
                // Largest values of f32.
                _ => below(&mut state, 128),
            }
        })
        .collect()
}
