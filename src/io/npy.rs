//! NumPy `.npy` files: one array behind a text header (a Python dict literal naming the
//! element type, the storage order and the shape).
//!
//! The reader trusts nothing in the header: every dimension must be a non-negative integer,
//! the element count and byte size are computed with overflow checks, and the declared size
//! must equal the data the file actually holds before anything is allocated, so a hostile
//! header can neither abort the process on a huge allocation nor make it hand back a
//! misread array. Big-endian data and Fortran (column-major) order are converted to the
//! little-endian row-major form of [`RawArray`]; element types other than bool, the integer
//! types and float16/32/64 (complex, strings, objects, structured types) are refused with a
//! message naming them.
//!
//! The writer emits a version 1.0 header (2.0 when a header would exceed 64 KiB), little
//! endian, C order, padded so the data starts on a 64-byte boundary, as NumPy does.

use std::borrow::Cow;

use anyhow::{bail, ensure, Context, Result};

use super::array::{data_size, Dtype, RawArray};

/// The first six bytes of every `.npy` file.
const MAGIC: &[u8; 6] = b"\x93NUMPY";

/// Parses a whole `.npy` file: its array, converted to little-endian row-major bytes
/// (borrowed from `bytes` when already in that form).
pub fn parse(bytes: &[u8]) -> Result<RawArray<'_>> {
    let (header, data) = split_header(bytes)?;
    let header = parse_header(header)?;
    let size = data_size(header.dtype, &header.shape)?;
    if data.len() < size {
        bail!(
            "truncated: the header's shape {:?} of {} declares {size} bytes of data, the file holds {}",
            header.shape,
            header.descr,
            data.len()
        );
    }
    if data.len() > size {
        bail!(
            "{} unexpected bytes after the array: the header's shape {:?} of {} declares {size} bytes, the file holds {} (several arrays saved into one file?)",
            data.len() - size,
            header.shape,
            header.descr,
            data.len()
        );
    }
    let mut data = Cow::Borrowed(data);
    if header.big_endian {
        data = Cow::Owned(swap_bytes(&data, header.dtype.bitsize() / 8));
    }
    if header.fortran_order && header.shape.len() > 1 {
        let storage_shape: Vec<usize> = header.shape.iter().rev().copied().collect();
        data = Cow::Owned(reverse_axes(
            &data,
            &storage_shape,
            header.dtype.bitsize() / 8,
        ));
    }
    Ok(RawArray {
        dtype: header.dtype,
        shape: header.shape,
        data,
    })
}

/// The bytes of an `.npy` file holding `array` (little-endian, C order).
pub fn encode(array: &RawArray<'_>) -> Result<Vec<u8>> {
    let descr = descr_of(array.dtype)?;
    let shape = match array.shape.as_slice() {
        [d] => format!("({d},)"),
        dims => format!(
            "({})",
            dims.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header =
        format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}").into_bytes();
    // Version 1.0 counts the header in 2 bytes, 2.0 in 4; the data starts 64-byte aligned.
    let padded_after = |prefix: usize| (prefix + header.len() + 1).next_multiple_of(64) - prefix;
    let long = padded_after(10) > usize::from(u16::MAX);
    let prefix = if long { 12 } else { 10 };
    let padded = padded_after(prefix);
    header.resize(padded - 1, b' ');
    header.push(b'\n');
    let mut out = Vec::with_capacity(prefix + header.len() + array.data.len());
    out.extend_from_slice(MAGIC);
    if long {
        let len = u32::try_from(header.len()).context("the .npy header is too long")?;
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&len.to_le_bytes());
    } else {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    }
    out.extend_from_slice(&header);
    out.extend_from_slice(&array.data);
    Ok(out)
}

/// The NumPy type string (little-endian) of an element type, for the types NumPy has.
pub(super) fn descr_of(dtype: Dtype) -> Result<&'static str> {
    Ok(match dtype {
        Dtype::BOOL => "|b1",
        Dtype::I8 => "|i1",
        Dtype::U8 => "|u1",
        Dtype::I16 => "<i2",
        Dtype::U16 => "<u2",
        Dtype::I32 => "<i4",
        Dtype::U32 => "<u4",
        Dtype::I64 => "<i8",
        Dtype::U64 => "<u8",
        Dtype::F16 => "<f2",
        Dtype::F32 => "<f4",
        Dtype::F64 => "<f8",
        other => bail!("element type {other} has no .npy equivalent; write a .safetensors file"),
    })
}

/// What the header says about the array.
#[derive(Debug)]
struct Header {
    descr: String,
    dtype: Dtype,
    big_endian: bool,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Splits a file into its header text and its data, checking the magic and version.
fn split_header(bytes: &[u8]) -> Result<(&str, &[u8])> {
    ensure!(
        bytes.starts_with(MAGIC),
        "not an .npy file (it does not start with \\x93NUMPY)"
    );
    let version = bytes
        .get(6..8)
        .context("truncated: the file ends inside the version")?;
    let (start, len) = match version[0] {
        1 => (
            10,
            bytes
                .get(8..10)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize),
        ),
        2 | 3 => (
            12,
            bytes
                .get(8..12)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize),
        ),
        major => bail!(
            "unsupported .npy format version {major}.{} (1.0 to 3.0 are read)",
            version[1]
        ),
    };
    let len = len.context("truncated: the file ends inside the header length")?;
    let held = bytes.len() - start.min(bytes.len());
    ensure!(
        len <= held,
        "truncated: the header length declares {len} bytes, the file holds {held}"
    );
    let text = std::str::from_utf8(&bytes[start..start + len])
        .ok()
        .filter(|t| t.is_ascii())
        .context("the header is not ASCII text")?;
    Ok((text, &bytes[start + len..]))
}

/// Parses the header dict: exactly the keys `descr`, `fortran_order` and `shape`.
fn parse_header(text: &str) -> Result<Header> {
    let entries = Literal::new(text).dict()?;
    let (mut descr, mut fortran_order, mut shape) = (None, None, None);
    for (key, value) in entries {
        let slot_taken = match key.as_str() {
            "descr" => descr.replace(value).is_some(),
            "fortran_order" => fortran_order.replace(value).is_some(),
            "shape" => shape.replace(value).is_some(),
            other => bail!("unexpected key '{other}' in the header"),
        };
        ensure!(!slot_taken, "duplicate key '{key}' in the header");
    }
    let descr = match descr.context("the header has no 'descr'")? {
        Value::Str(s) => s,
        other => bail!(
            "unsupported element type {} (structured types are not read)",
            other.describe()
        ),
    };
    let (dtype, big_endian) = element_type(&descr)?;
    let fortran_order = match fortran_order.context("the header has no 'fortran_order'")? {
        Value::Bool(b) => b,
        other => bail!("'fortran_order' is {}, not True or False", other.describe()),
    };
    let shape = match shape.context("the header has no 'shape'")? {
        Value::Tuple(dims) => dims,
        other => bail!("'shape' is {}, not a tuple", other.describe()),
    };
    Ok(Header {
        descr,
        dtype,
        big_endian,
        fortran_order,
        shape,
    })
}

/// The element type and byte order (true: big-endian) of a NumPy type string.
fn element_type(descr: &str) -> Result<(Dtype, bool)> {
    let (order, code) = match descr.as_bytes().first() {
        Some(&c @ (b'<' | b'>' | b'|' | b'=')) => (c, &descr[1..]),
        _ => (b'=', descr),
    };
    let dtype = match code {
        "b1" => Dtype::BOOL,
        "i1" => Dtype::I8,
        "u1" => Dtype::U8,
        "i2" => Dtype::I16,
        "u2" => Dtype::U16,
        "i4" => Dtype::I32,
        "u4" => Dtype::U32,
        "i8" => Dtype::I64,
        "u8" => Dtype::U64,
        "f2" => Dtype::F16,
        "f4" => Dtype::F32,
        "f8" => Dtype::F64,
        _ => bail!(
            "unsupported element type '{descr}' (read: bool, int8 to int64, uint8 to uint64, float16, float32, float64)"
        ),
    };
    let big_endian = match order {
        b'>' => true,
        b'<' => false,
        _ => cfg!(target_endian = "big"),
    };
    Ok((dtype, big_endian && dtype.bitsize() > 8))
}

/// `data` with the bytes of each `width`-byte element reversed.
fn swap_bytes(data: &[u8], width: usize) -> Vec<u8> {
    data.chunks_exact(width)
        .flat_map(|element| element.iter().rev().copied())
        .collect()
}

/// The row-major bytes of the array with every axis reversed (its transpose, for any rank),
/// from the row-major bytes `data` of an array of `shape` with `width`-byte elements. A
/// Fortran-order file stores the transpose of its array in row-major order, so this turns
/// its data into the array's own row-major order.
fn reverse_axes(data: &[u8], shape: &[usize], width: usize) -> Vec<u8> {
    if data.is_empty() {
        return Vec::new();
    }
    // Axes of length 1 move nothing; leaving them out bounds the rank by log2 of the count.
    let shape: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
    let rank = shape.len();
    // Element strides of the transposed array, indexed by the source axis they belong to.
    let mut strides = vec![0usize; rank];
    let mut stride = 1;
    for (axis, &dim) in shape.iter().enumerate() {
        strides[axis] = stride;
        stride *= dim;
    }
    let mut out = vec![0u8; data.len()];
    let mut index = vec![0usize; rank];
    for element in data.chunks_exact(width) {
        let target: usize = index.iter().zip(&strides).map(|(i, s)| i * s).sum();
        out[target * width..(target + 1) * width].copy_from_slice(element);
        // Advance the row-major index of the source.
        for axis in (0..rank).rev() {
            index[axis] += 1;
            if index[axis] < shape[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

/// A value of the header dict.
#[derive(Debug)]
enum Value {
    Str(String),
    Bool(bool),
    Tuple(Vec<usize>),
    /// Anything else (a number, a list such as a structured type's descr), as text.
    Raw(String),
}

impl Value {
    /// The value as the header spells it, for messages.
    fn describe(&self) -> String {
        match self {
            Value::Str(s) => format!("'{s}'"),
            Value::Bool(b) => if *b { "True" } else { "False" }.to_string(),
            Value::Tuple(dims) => format!("{dims:?}"),
            Value::Raw(text) => text.clone(),
        }
    }
}

/// A cursor over the header's Python literal.
struct Literal<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Literal<'a> {
    fn new(text: &'a str) -> Self {
        Literal { text, at: 0 }
    }

    fn rest(&self) -> &'a str {
        &self.text[self.at..]
    }

    fn skip_space(&mut self) {
        let rest = self.rest();
        self.at += rest.len() - rest.trim_start().len();
    }

    /// Consumes `token` (after spaces) if it comes next.
    fn eat(&mut self, token: &str) -> bool {
        self.skip_space();
        let found = self.rest().starts_with(token);
        if found {
            self.at += token.len();
        }
        found
    }

    fn expect(&mut self, token: &str) -> Result<()> {
        ensure!(
            self.eat(token),
            "malformed header: expected `{token}` at byte {} of {:?}",
            self.at,
            self.text
        );
        Ok(())
    }

    /// `{key: value, ...}` with an optional trailing comma, then only spaces.
    fn dict(&mut self) -> Result<Vec<(String, Value)>> {
        self.expect("{")?;
        let mut entries = Vec::new();
        while !self.eat("}") {
            let key = self.string()?;
            self.expect(":")?;
            entries.push((key, self.value()?));
            if !self.eat(",") {
                self.expect("}")?;
                break;
            }
        }
        self.skip_space();
        ensure!(
            self.rest().is_empty(),
            "malformed header: unexpected text after the dict: {:?}",
            self.rest()
        );
        Ok(entries)
    }

    fn value(&mut self) -> Result<Value> {
        self.skip_space();
        if self.eat("True") {
            Ok(Value::Bool(true))
        } else if self.eat("False") {
            Ok(Value::Bool(false))
        } else if self.rest().starts_with('(') {
            self.tuple().map(Value::Tuple)
        } else if self.rest().starts_with(['\'', '"']) {
            self.string().map(Value::Str)
        } else {
            self.raw().map(Value::Raw)
        }
    }

    /// A quoted string (single or double quotes, no escapes).
    fn string(&mut self) -> Result<String> {
        self.skip_space();
        let rest = self.rest();
        let quote = rest
            .chars()
            .next()
            .filter(|c| *c == '\'' || *c == '"')
            .with_context(|| format!("malformed header: expected a string at {rest:?}"))?;
        let end = rest[1..]
            .find(quote)
            .context("malformed header: a string is not closed")?;
        self.at += end + 2;
        Ok(rest[1..1 + end].to_string())
    }

    /// A tuple of dimensions: `()`, `(3,)`, `(2, 3)`, with an optional trailing comma.
    fn tuple(&mut self) -> Result<Vec<usize>> {
        self.expect("(")?;
        let mut dims = Vec::new();
        while !self.eat(")") {
            dims.push(self.dimension()?);
            if !self.eat(",") {
                self.expect(")")?;
                break;
            }
        }
        Ok(dims)
    }

    /// One dimension: a non-negative integer that fits in 64 bits (a Python 2 `L` suffix is
    /// allowed).
    fn dimension(&mut self) -> Result<usize> {
        self.skip_space();
        let rest = self.rest();
        let negative = rest.starts_with('-');
        let digits = rest[usize::from(negative)..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - usize::from(negative));
        let number = &rest[..usize::from(negative) + digits];
        ensure!(
            digits > 0,
            "malformed header: expected a dimension at {rest:?}"
        );
        ensure!(!negative, "negative dimension {number} in the shape");
        let value: usize = number
            .parse()
            .ok()
            .with_context(|| format!("dimension {number} in the shape is too large (overflow)"))?;
        self.at += number.len();
        self.eat("L");
        Ok(value)
    }

    /// Any other value, as text up to the next `,` or `}` outside brackets and quotes.
    fn raw(&mut self) -> Result<String> {
        let rest = self.rest();
        let (mut depth, mut quote) = (0usize, None);
        for (i, c) in rest.char_indices() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '\'' | '"') => quote = Some(c),
                (None, '[' | '(' | '{') => depth += 1,
                (None, ']' | ')' | '}') if depth > 0 => depth -= 1,
                (None, ',' | '}') if depth == 0 => {
                    let text = rest[..i].trim();
                    ensure!(!text.is_empty(), "malformed header: a value is missing");
                    self.at += i;
                    return Ok(text.to_string());
                }
                _ => {}
            }
        }
        bail!("malformed header: a value is not closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&[1, 0]);
        v.extend_from_slice(&(header.len() as u16).to_le_bytes());
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn encoded_arrays_parse_back() {
        for (dtype, shape) in [
            (Dtype::F32, vec![2, 3]),
            (Dtype::U16, vec![5]),
            (Dtype::BOOL, vec![]),
            (Dtype::F64, vec![0, 4]),
        ] {
            let n = data_size(dtype, &shape).unwrap();
            let array = RawArray {
                dtype,
                shape,
                data: Cow::Owned((0..n).map(|i| i as u8).collect()),
            };
            let bytes = encode(&array).unwrap();
            assert_eq!(bytes.len() % 64, n % 64, "data starts 64-byte aligned");
            assert_eq!(parse(&bytes).unwrap(), array);
        }
    }

    #[test]
    fn a_header_too_long_for_version_1_is_written_as_version_2() {
        let array = RawArray {
            dtype: Dtype::U8,
            shape: vec![1; 30_000],
            data: Cow::Owned(vec![42]),
        };
        let bytes = encode(&array).unwrap();
        assert_eq!(bytes[6], 2);
        assert_eq!(parse(&bytes).unwrap(), array);
    }

    #[test]
    fn fortran_order_and_big_endian_become_row_major_little_endian() {
        // The 2x3 array [[1, 2, 3], [4, 5, 6]] as >i2, column after column.
        let data: Vec<u8> = [1i16, 4, 2, 5, 3, 6]
            .iter()
            .flat_map(|v| v.to_be_bytes())
            .collect();
        let bytes = file(
            "{'descr': '>i2', 'fortran_order': True, 'shape': (2, 3), }\n",
            &data,
        );
        let array = parse(&bytes).unwrap();
        let want: Vec<u8> = (1i16..=6).flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(array.dtype, Dtype::I16);
        assert_eq!(array.shape, [2, 3]);
        assert_eq!(array.data, want);
    }

    #[test]
    fn reversing_every_axis_of_a_rank_three_array() {
        // Shape (2, 3, 4), element (i, j, k) = 12i + 4j + k; the result has shape (4, 3, 2)
        // and element (k, j, i) = 12i + 4j + k.
        let data: Vec<u8> = (0..24).collect();
        let out = reverse_axes(&data, &[2, 3, 4], 1);
        for k in 0..4 {
            for j in 0..3 {
                for i in 0..2 {
                    assert_eq!(out[k * 6 + j * 2 + i] as usize, 12 * i + 4 * j + k);
                }
            }
        }
    }

    #[test]
    fn hostile_headers_are_errors_that_name_the_problem() {
        let cases = [
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387905, 4), }",
                "overflow",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (18446744073709551617,), }",
                "overflow",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (-1, 4), }",
                "negative",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }",
                "declares 400000000000 bytes",
            ),
            (
                "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }",
                "unsupported element type '<c8'",
            ),
            (
                "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }",
                "structured",
            ),
            (
                "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }",
                "duplicate",
            ),
            (
                "{'descr': '<f4', 'fortran_order': 0, 'shape': (1,), }",
                "fortran_order",
            ),
            ("{'descr': '<f4', 'shape': (1,), }", "no 'fortran_order'"),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
                "unexpected key",
            ),
            (
                "{'descr': '<f4', 'fortran_order': False, 'shape': (1,) ",
                "malformed",
            ),
        ];
        for (header, needle) in cases {
            let err = format!("{:#}", parse(&file(header, &[0; 16])).unwrap_err());
            assert!(err.contains(needle), "{header}: {err}");
        }
    }
}
