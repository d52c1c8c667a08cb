//! im2col and its adjoint col2im for 2-D convolution over NCHW images.
//!
//! # Layout
//!
//! For one image of `C` channels and `H x W` pixels, a kernel of `KH x KW` taps, stride `s`,
//! zero padding `p` and dilation `d` (the same on both axes), the output has
//! `OH = (H + 2p - d(KH-1) - 1) / s + 1` rows and `OW` (likewise) columns. The column
//! matrix is a row-major `K x P` matrix with
//!
//! * `K = C * KH * KW` **rows**, row `r = (c * KH + i) * KW + j` for channel `c` and kernel
//!   tap `(i, j)` (the order of a contiguous `(OC, C, KH, KW)` weight's trailing dims, so a
//!   weight is the row-major `OC x K` matrix that multiplies it);
//! * `P = OH * OW` **columns**, column `q = oy * OW + ox` for output pixel `(oy, ox)` (the
//!   order of a contiguous `(OC, OH, OW)` output plane);
//!
//! and element `(r, q)` at index `r * P + q` holding the input pixel
//! `x[c, oy*s + i*d - p, ox*s + j*d - p]`, or the pad value where that lies outside the image.
//!
//! So convolution is `Y (OC x P) = W (OC x K) * cols (K x P)`, and col2im, which adds every
//! element of a `K x P` matrix back into the pixel it was read from, is the adjoint of
//! im2col: the input gradient is `col2im(W^T * dY)`.
//!
//! Writes are sequential: [`im2col`] fills the column matrix row by row (a row of `P` entries
//! is `OH` runs of `OW` contiguous entries, each a pad prefix, a copied middle and a pad
//! suffix); [`col2im`] reads the column matrix in order and adds each run of `OW` entries into
//! one image row (contiguous when `s = 1`). The kernels are generic over the element type so
//! that other number representations (bit patterns, integers) can share the layout.

use std::ops::AddAssign;

/// The geometry of one 2-D convolution: input image, kernel and output sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvGeom {
    /// Input channels `C`.
    pub channels: usize,
    /// Input height `H`.
    pub height: usize,
    /// Input width `W`.
    pub width: usize,
    /// Kernel height `KH`.
    pub kernel_h: usize,
    /// Kernel width `KW`.
    pub kernel_w: usize,
    /// Stride `s` (both axes).
    pub stride: usize,
    /// Zero padding `p` on every side.
    pub padding: usize,
    /// Dilation `d` (both axes).
    pub dilation: usize,
    /// Output height `OH`.
    pub out_h: usize,
    /// Output width `OW`.
    pub out_w: usize,
}

/// The output length of a convolution along one axis, None when the (padded) input is
/// shorter than the dilated kernel or a parameter is zero.
pub fn out_size(
    input: usize,
    kernel: usize,
    stride: usize,
    padding: usize,
    dilation: usize,
) -> Option<usize> {
    if kernel == 0 || stride == 0 || dilation == 0 {
        return None;
    }
    let span = dilation.checked_mul(kernel - 1)?.checked_add(1)?;
    let padded = input.checked_add(padding.checked_mul(2)?)?;
    (padded >= span).then(|| (padded - span) / stride + 1)
}

impl ConvGeom {
    /// The geometry for a `C x H x W` input and a `KH x KW` kernel; None when the output
    /// would be empty or a parameter is zero.
    pub fn new(
        (channels, height, width): (usize, usize, usize),
        (kernel_h, kernel_w): (usize, usize),
        stride: usize,
        padding: usize,
        dilation: usize,
    ) -> Option<Self> {
        Some(ConvGeom {
            channels,
            height,
            width,
            kernel_h,
            kernel_w,
            stride,
            padding,
            dilation,
            out_h: out_size(height, kernel_h, stride, padding, dilation)?,
            out_w: out_size(width, kernel_w, stride, padding, dilation)?,
        })
    }

    /// Rows of the column matrix: `K = C * KH * KW`.
    pub fn rows(&self) -> usize {
        self.channels * self.kernel_h * self.kernel_w
    }

    /// Columns of the column matrix: `P = OH * OW`.
    pub fn cols(&self) -> usize {
        self.out_h * self.out_w
    }

    /// Pixels of one input image: `C * H * W`.
    pub fn image_len(&self) -> usize {
        self.channels * self.height * self.width
    }

    /// The output positions `o` in `0..n_out` whose input coordinate `o*s + tap*d - p` lies in
    /// `0..n_in`, as a half-open range.
    #[inline]
    fn valid(&self, tap: usize, n_in: usize, n_out: usize) -> (usize, usize) {
        let (s, off) = (self.stride, tap * self.dilation);
        let p = self.padding;
        // o*s + off >= p  <=>  o >= ceil((p - off) / s)
        let lo = if off >= p { 0 } else { (p - off).div_ceil(s) };
        // o*s + off < n_in + p  <=>  o < ceil((n_in + p - off) / s)
        let hi = if n_in + p > off {
            (n_in + p - off).div_ceil(s)
        } else {
            0
        };
        (lo.min(n_out), hi.min(n_out).max(lo.min(n_out)))
    }
}

/// Fills `dst` (`geom.rows() x geom.cols()`, row-major, see the module docs) from one image.
///
/// The image is read at `src[offset + c*strides[0] + y*strides[1] + x*strides[2]]`, so any
/// strided view of an NCHW tensor can be read without a copy.
///
/// # Panics
/// If `dst` is shorter than `rows() * cols()` or the image reaches past the end of `src`.
pub fn im2col<T: Copy + Send + Sync>(
    src: &[T],
    offset: usize,
    strides: [usize; 3],
    geom: &ConvGeom,
    pad: T,
    dst: &mut [T],
) {
    im2col_strided(src, offset, strides, geom, pad, dst, geom.cols());
}

/// [`im2col`] into a matrix whose rows lie `row_stride >= cols()` elements apart: row `r`
/// of the column matrix fills `dst[r * row_stride..][..cols()]`, and the elements between
/// rows are left as they are (so several images' column matrices can sit side by side in
/// one wider matrix).
///
/// # Panics
/// If `row_stride < cols()`, `dst` is shorter than `(rows() - 1) * row_stride + cols()` or
/// the image reaches past the end of `src`.
pub fn im2col_strided<T: Copy + Send + Sync>(
    src: &[T],
    offset: usize,
    strides: [usize; 3],
    geom: &ConvGeom,
    pad: T,
    dst: &mut [T],
    row_stride: usize,
) {
    let p = geom.cols();
    assert!(
        row_stride >= p,
        "im2col: row stride {row_stride} below {p} columns"
    );
    for r in 0..geom.rows() {
        im2col_row(
            src,
            offset,
            strides,
            geom,
            pad,
            r,
            &mut dst[r * row_stride..r * row_stride + p],
        );
    }
}

/// Row `r` of one image's column matrix ([`im2col`]) into `dst` (`cols()` entries): the
/// input pixels that kernel tap `(i, j)` of channel `c` reads for every output pixel, with
/// `r = (c * KH + i) * KW + j`.
///
/// # Panics
/// If `r >= rows()`, `dst` is shorter than `cols()` or the image reaches past the end of
/// `src`.
pub fn im2col_row<T: Copy>(
    src: &[T],
    offset: usize,
    strides: [usize; 3],
    geom: &ConvGeom,
    pad: T,
    r: usize,
    dst: &mut [T],
) {
    assert!(r < geom.rows(), "im2col: row {r} of {}", geom.rows());
    let (ow, p) = (geom.out_w, geom.cols());
    let [sc, sy, sx] = strides;
    let taps = geom.kernel_h * geom.kernel_w;
    let (c, i, j) = (r / taps, r % taps / geom.kernel_w, r % geom.kernel_w);
    let row = &mut dst[..p];
    if geom.padding == 0 && geom.stride == 1 && geom.dilation == 1 && sx == 1 {
        // Every window lies inside the image and image rows are contiguous: the row is
        // `OH` runs of `OW` consecutive input elements, one input row apart.
        let mut start = offset + c * sc + i * sy + j;
        for run in row.chunks_exact_mut(ow) {
            copy_short(run, &src[start..start + ow]);
            start += sy;
        }
        return;
    }
    let step = geom.stride * sx;
    let (ylo, yhi) = geom.valid(i, geom.height, geom.out_h);
    let (xlo, xhi) = geom.valid(j, geom.width, geom.out_w);
    for (oy, run) in row.chunks_exact_mut(ow).enumerate() {
        if oy < ylo || oy >= yhi || xlo >= xhi {
            run.fill(pad);
            continue;
        }
        let y = oy * geom.stride + i * geom.dilation - geom.padding;
        let x0 = xlo * geom.stride + j * geom.dilation - geom.padding;
        let base = offset + c * sc + y * sy + x0 * sx;
        run[..xlo].fill(pad);
        let mid = &mut run[xlo..xhi];
        if step == 1 {
            copy_short(mid, &src[base..base + mid.len()]);
        } else {
            for (k, d) in mid.iter_mut().enumerate() {
                *d = src[base + k * step];
            }
        }
        run[xhi..].fill(pad);
    }
}

/// `dst.copy_from_slice(src)` for the short runs of im2col (an image row, tens of elements):
/// eight elements at a time as fixed-size copies, which compile to inline vector moves,
/// where `copy_from_slice` would call `memcpy` for every run.
#[inline(always)]
fn copy_short<T: Copy>(dst: &mut [T], src: &[T]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let s: &[T; 8] = s.try_into().expect("a chunk of 8");
        let d: &mut [T; 8] = d.try_into().expect("a chunk of 8");
        *d = *s;
    }
    for (d, &s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = s;
    }
}

/// Adds every entry of the column matrix `cols` (`geom.rows() x geom.cols()`, row-major) into
/// the pixel of the contiguous `C x H x W` image `dst` it was read from by [`im2col`];
/// entries that came from padding are dropped. `dst` is accumulated into, not overwritten.
///
/// # Panics
/// If `cols` or `dst` is shorter than the geometry says.
pub fn col2im<T: Copy + AddAssign>(cols: &[T], geom: &ConvGeom, dst: &mut [T]) {
    let (ow, p) = (geom.out_w, geom.cols());
    let (h, w) = (geom.height, geom.width);
    let dst = &mut dst[..geom.image_len()];
    let s = geom.stride;
    let mut rows = cols[..geom.rows() * p].chunks_exact(p);
    for c in 0..geom.channels {
        let plane = &mut dst[c * h * w..(c + 1) * h * w];
        for i in 0..geom.kernel_h {
            let (ylo, yhi) = geom.valid(i, h, geom.out_h);
            for j in 0..geom.kernel_w {
                let (xlo, xhi) = geom.valid(j, w, geom.out_w);
                let Some(row) = rows.next() else { return };
                if xlo >= xhi {
                    continue;
                }
                for oy in ylo..yhi {
                    let y = oy * s + i * geom.dilation - geom.padding;
                    let x0 = xlo * s + j * geom.dilation - geom.padding;
                    let run = &row[oy * ow + xlo..oy * ow + xhi];
                    let line = &mut plane[y * w..(y + 1) * w];
                    if s == 1 {
                        for (d, &v) in line[x0..x0 + run.len()].iter_mut().zip(run) {
                            *d += v;
                        }
                    } else {
                        for (k, &v) in run.iter().enumerate() {
                            line[x0 + k * s] += v;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_size_matches_the_pytorch_formula() {
        assert_eq!(out_size(32, 5, 1, 0, 1), Some(28));
        assert_eq!(out_size(7, 3, 2, 1, 1), Some(4));
        assert_eq!(out_size(7, 3, 1, 0, 3), Some(1));
        assert_eq!(out_size(4, 5, 1, 0, 1), None);
        assert_eq!(out_size(4, 3, 0, 0, 1), None);
    }

    /// col2im is the adjoint of im2col: <im2col(x), c> == <x, col2im(c)>, checked against a
    /// direct evaluation of the layout formula.
    #[test]
    fn im2col_follows_the_documented_layout_and_col2im_is_its_adjoint() {
        for &(c, h, w, kh, kw, s, p, d) in &[
            (2, 7, 6, 3, 2, 1, 0, 1),
            (3, 9, 8, 3, 3, 2, 1, 1),
            (1, 10, 11, 3, 2, 3, 2, 2),
            (2, 5, 5, 5, 5, 1, 4, 1),
            (1, 6, 9, 2, 4, 1, 0, 1),
        ] {
            let g = ConvGeom::new((c, h, w), (kh, kw), s, p, d).unwrap();
            let x: Vec<f64> = (0..g.image_len())
                .map(|v| (v * 7 % 13) as f64 + 0.5)
                .collect();
            let mut cols = vec![f64::NAN; g.rows() * g.cols()];
            im2col(&x, 0, [h * w, w, 1], &g, -1.0, &mut cols);
            let mut back = vec![0.0; g.image_len()];
            let probe: Vec<f64> = (0..cols.len()).map(|v| (v % 5) as f64).collect();
            col2im(&probe, &g, &mut back);
            let mut expect_back = vec![0.0; g.image_len()];
            for ci in 0..c {
                for i in 0..kh {
                    for j in 0..kw {
                        let r = (ci * kh + i) * kw + j;
                        for oy in 0..g.out_h {
                            for ox in 0..g.out_w {
                                let q = oy * g.out_w + ox;
                                let y = (oy * s + i * d) as isize - p as isize;
                                let xx = (ox * s + j * d) as isize - p as isize;
                                let inside =
                                    y >= 0 && xx >= 0 && (y as usize) < h && (xx as usize) < w;
                                let want = if inside {
                                    let k = ci * h * w + y as usize * w + xx as usize;
                                    expect_back[k] += probe[r * g.cols() + q];
                                    x[k]
                                } else {
                                    -1.0
                                };
                                assert_eq!(cols[r * g.cols() + q], want);
                            }
                        }
                    }
                }
            }
            assert_eq!(back, expect_back);
            // The same image inside a larger buffer: an offset and a gap after every row.
            let (gap, offset) = (2, 3);
            let mut wide = vec![f64::NAN; offset + c * h * (w + gap)];
            for (k, &v) in x.iter().enumerate() {
                let (ci, y, xx) = (k / (h * w), k / w % h, k % w);
                wide[offset + (ci * h + y) * (w + gap) + xx] = v;
            }
            let mut strided = vec![f64::NAN; cols.len()];
            let strides = [h * (w + gap), w + gap, 1];
            im2col(&wide, offset, strides, &g, -1.0, &mut strided);
            assert_eq!(strided, cols);
            // Rows `row_stride` apart: each row where `im2col` puts it, the gaps untouched.
            let (p, row_stride) = (g.cols(), g.cols() + 3);
            let mut spaced = vec![f64::NAN; (g.rows() - 1) * row_stride + p];
            im2col_strided(&x, 0, [h * w, w, 1], &g, -1.0, &mut spaced, row_stride);
            for (e, v) in spaced.iter().enumerate() {
                let (r, q) = (e / row_stride, e % row_stride);
                if q < p {
                    assert_eq!(*v, cols[r * p + q], "row {r} column {q}");
                } else {
                    assert!(v.is_nan(), "gap {q} after row {r} written");
                }
            }
        }
    }
}
