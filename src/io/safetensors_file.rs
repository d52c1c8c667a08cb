//! `.safetensors` files: an 8-byte little-endian header length, a JSON header mapping each
//! tensor name to its element type, shape and byte range, an optional `__metadata__` map of
//! strings, then the tensors' bytes.
//!
//! The reader checks, before it allocates anything the header asks for: that the header
//! length fits in the file; that no name appears twice (a JSON parser keeps only one of two
//! equal keys, which would silently drop a tensor); that every shape's byte size is
//! computed without overflow and matches its byte range; that the ranges tile the data
//! from its first byte to its last with no gap or overlap; and that the file holds exactly
//! that data, no less (a truncated file) and no more. Any element type of the format is
//! read, so tensors this crate cannot round are still carried through unchanged.
//!
//! The writer is the `safetensors` crate's serializer, with the metadata map kept and the
//! header's keys put in sorted order ([`with_sorted_header`]): the crate writes the metadata
//! in the order of a `HashMap`, which changes from one process to the next, so without it
//! the same tensors and metadata would not always give the same bytes.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;

use anyhow::{bail, ensure, Context, Result};
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde::Deserialize;

use super::array::{data_size, Dtype, RawArray, RawFile};

/// Bytes of the header-length field.
const LENGTH_BYTES: usize = 8;

/// Parses a whole `.safetensors` file: its tensors (sorted by name, data borrowed from
/// `bytes`) and its metadata.
pub fn parse(bytes: &[u8]) -> Result<RawFile<'_>> {
    let (header, data) = split_header(bytes)?;
    let header: Header =
        serde_json::from_str(header).context("the header is not a valid safetensors header")?;
    let mut entries = header.tensors;
    for (name, entry) in &entries {
        entry
            .check_size()
            .with_context(|| format!("tensor `{name}`"))?;
    }
    entries.sort_by_key(|(_, e)| e.offsets);
    let end = check_tiling(&entries)?;
    ensure!(
        end <= data.len() as u64,
        "truncated: the header declares {end} bytes of tensor data, the file holds {}",
        data.len()
    );
    ensure!(
        end == data.len() as u64,
        "{} unexpected bytes after the tensor data (the header declares {end} bytes, the file holds {})",
        data.len() as u64 - end,
        data.len()
    );
    let mut tensors: Vec<(String, RawArray<'_>)> = entries
        .into_iter()
        .map(|(name, entry)| {
            // Every range lies within `data`: the ranges tile `0..end` and `end` fits.
            let range = entry.offsets.0 as usize..entry.offsets.1 as usize;
            let array = RawArray {
                dtype: entry.dtype,
                shape: entry.dims(),
                data: Cow::Borrowed(&data[range]),
            };
            (name, array)
        })
        .collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(RawFile {
        tensors,
        metadata: header.metadata,
    })
}

/// The bytes of a `.safetensors` file holding `file`'s tensors and metadata.
pub fn encode(file: &RawFile<'_>) -> Result<Vec<u8>> {
    let mut names = HashSet::new();
    let mut views = Vec::with_capacity(file.tensors.len());
    for (name, array) in &file.tensors {
        ensure!(
            names.insert(name.as_str()),
            "duplicate tensor name `{name}`"
        );
        let view =
            safetensors::tensor::TensorView::new(array.dtype, array.shape.clone(), &array.data)
                .map_err(|e| anyhow::anyhow!("tensor `{name}`: {e}"))?;
        views.push((name.as_str(), view));
    }
    let bytes = safetensors::serialize(views, file.metadata.clone())
        .map_err(|e| anyhow::anyhow!("cannot serialize the tensors: {e}"))?;
    with_sorted_header(bytes)
}

/// The same safetensors file with every object of its JSON header written with its keys in
/// sorted order (then padded with spaces to its former length, so the data does not move):
/// the bytes then depend only on the tensors and the metadata, not on a map's order.
pub fn with_sorted_header(bytes: Vec<u8>) -> Result<Vec<u8>> {
    let (header, data) = split_header(&bytes)?;
    let value: serde_json::Value =
        serde_json::from_str(header).context("the header is not valid JSON")?;
    let mut sorted = serde_json::to_string(&sort_keys(value))?.into_bytes();
    ensure!(
        sorted.len() <= header.len(),
        "the sorted header is longer than the one written"
    );
    sorted.resize(header.len(), b' ');
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&(sorted.len() as u64).to_le_bytes());
    out.extend_from_slice(&sorted);
    out.extend_from_slice(data);
    Ok(out)
}

/// `value` with the keys of every object inserted in sorted order (so the output is sorted
/// whether serde_json's map keeps sorted or insertion order).
fn sort_keys(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(k, v)| (k, sort_keys(v)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(sort_keys).collect())
        }
        other => other,
    }
}

/// Splits a file into its header text and its data, checking the length field.
fn split_header(bytes: &[u8]) -> Result<(&str, &[u8])> {
    let Some((length, rest)) = bytes.split_first_chunk::<LENGTH_BYTES>() else {
        bail!(
            "truncated: {} bytes, fewer than the {LENGTH_BYTES}-byte header length",
            bytes.len()
        );
    };
    let declared = u64::from_le_bytes(*length);
    ensure!(
        declared <= rest.len() as u64,
        "truncated or not a safetensors file: the header length declares {declared} bytes, the file holds {} after it",
        rest.len()
    );
    let (header, data) = rest.split_at(declared as usize);
    let header = std::str::from_utf8(header).context("the header is not UTF-8 text")?;
    Ok((header, data))
}

/// Checks that the byte ranges (sorted by start) cover `0..end` exactly once, and returns
/// `end`.
fn check_tiling(entries: &[(String, Entry)]) -> Result<u64> {
    let mut next = 0u64;
    for (name, entry) in entries {
        let (start, end) = entry.offsets;
        ensure!(
            start == next,
            "tensor `{name}` starts at byte {start} of the data where byte {next} was expected (the byte ranges overlap or leave a gap)"
        );
        next = end;
    }
    Ok(next)
}

/// The header: every tensor's entry in file order and the metadata map. Deserialized by
/// hand so that a repeated name is an error rather than one entry silently replacing the
/// other.
struct Header {
    tensors: Vec<(String, Entry)>,
    metadata: Option<HashMap<String, String>>,
}

/// One tensor's entry in the header.
#[derive(Deserialize)]
struct Entry {
    dtype: Dtype,
    shape: Vec<Dimension>,
    #[serde(rename = "data_offsets")]
    offsets: (u64, u64),
}

impl Entry {
    /// Checks that the byte range is ordered and as long as the shape and type require.
    fn check_size(&self) -> Result<()> {
        let (start, end) = self.offsets;
        ensure!(
            start <= end,
            "its byte range {start}..{end} ends before it starts"
        );
        let shape = self.dims();
        let needed = data_size(self.dtype, &shape)?;
        ensure!(
            needed as u64 == end - start,
            "shape {shape:?} of {} needs {needed} bytes, its byte range {start}..{end} holds {}",
            self.dtype,
            end - start
        );
        Ok(())
    }
}

impl Entry {
    /// The shape as plain numbers.
    fn dims(&self) -> Vec<usize> {
        self.shape.iter().map(|d| d.0).collect()
    }
}

/// A dimension: a non-negative integer, with a message saying so when it is not.
struct Dimension(usize);

impl<'de> Deserialize<'de> for Dimension {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DimensionVisitor;
        impl Visitor<'_> for DimensionVisitor {
            type Value = Dimension;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a non-negative integer dimension")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Dimension, E> {
                usize::try_from(v)
                    .map(Dimension)
                    .map_err(|_| E::custom(format!("dimension {v} is too large")))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Dimension, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::custom(format!("negative dimension {v}"))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Dimension, E> {
                Err(E::custom(format!(
                    "dimension {v} is not an integer below 2^64"
                )))
            }
        }
        deserializer.deserialize_any(DimensionVisitor)
    }
}

impl<'de> Deserialize<'de> for Header {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct HeaderVisitor;
        impl<'de> Visitor<'de> for HeaderVisitor {
            type Value = Header;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object of tensor entries")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Header, A::Error> {
                let mut header = Header {
                    tensors: Vec::new(),
                    metadata: None,
                };
                let mut names = HashSet::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "__metadata__" {
                        if header.metadata.is_some() {
                            return Err(A::Error::custom("duplicate `__metadata__` entry"));
                        }
                        header.metadata = Some(map.next_value::<UniqueStrings>()?.0);
                        continue;
                    }
                    if !names.insert(key.clone()) {
                        return Err(A::Error::custom(format!("duplicate tensor name `{key}`")));
                    }
                    let entry = map
                        .next_value::<Entry>()
                        .map_err(|e| A::Error::custom(format!("tensor `{key}`: {e}")))?;
                    header.tensors.push((key, entry));
                }
                Ok(header)
            }
        }
        deserializer.deserialize_map(HeaderVisitor)
    }
}

/// A JSON object of strings in which a repeated key is an error.
struct UniqueStrings(HashMap<String, String>);

impl<'de> Deserialize<'de> for UniqueStrings {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UniqueVisitor;
        impl<'de> Visitor<'de> for UniqueVisitor {
            type Value = UniqueStrings;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UniqueStrings, A::Error> {
                let mut strings = HashMap::new();
                while let Some((key, value)) = map.next_entry::<String, String>()? {
                    if strings.contains_key(&key) {
                        return Err(A::Error::custom(format!(
                            "duplicate `__metadata__` key `{key}`"
                        )));
                    }
                    strings.insert(key, value);
                }
                Ok(UniqueStrings(strings))
            }
        }
        deserializer.deserialize_map(UniqueVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file with several metadata keys and tensors, rebuilt (so its metadata map is a new
    /// `HashMap` with its own order) before every encode.
    fn file() -> RawFile<'static> {
        let metadata = (0..8).map(|i| (format!("key{i}"), format!("value {i}")));
        let tensor = |name: &str, bytes: Vec<u8>| {
            let array = RawArray {
                dtype: Dtype::U8,
                shape: vec![bytes.len()],
                data: Cow::Owned(bytes),
            };
            (name.to_string(), array)
        };
        RawFile {
            tensors: vec![tensor("a", vec![1, 2, 3]), tensor("b", vec![4; 9])],
            metadata: Some(metadata.collect()),
        }
    }

    #[test]
    fn the_same_tensors_and_metadata_encode_to_the_same_bytes_and_read_back() {
        let first = encode(&file()).unwrap();
        for _ in 0..16 {
            assert!(encode(&file()).unwrap() == first);
        }
        let header_length = u64::from_le_bytes(first[..8].try_into().unwrap());
        assert_eq!(header_length % 8, 0, "the header stays padded to 8 bytes");
        assert_eq!(parse(&first).unwrap(), file());
    }
}
