//! Tensor files and `qcandle quantize`: `.npy` headers whose shape overflows, declares more
//! data than the file holds, has a negative dimension, big-endian or Fortran-order data, or
//! an element type that cannot be read; `.safetensors` files with a huge header length,
//! byte ranges past the end or not matching their shape, truncated, or with a repeated
//! tensor name; `quantize` keeping the metadata map and every non-float tensor byte for
//! byte; output permissions under the umask; errors that name the unwritable output or the
//! unreadable input; and seeded mutation passes over both parsers, checking that no input
//! panics or makes a parser allocate beyond a small multiple of its length.

use std::borrow::Cow;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use candle_core::{Device, Tensor};
use qcandle::io::{data_size, npy, safetensors_file, Dtype, RawArray, RawFile};
use qcandle::{quantize, Quant};
use safetensors::tensor::TensorView;

use crate::cli::{assert_clean_failure, qcandle, qcandle_after, stderr, stdout, BINARY};
use crate::{largest_allocation, Rng};

/// An `.npy` file (version 1.0) with `header` (padded so the data starts 64-byte aligned)
/// followed by `data`.
fn npy_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut header = header.to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    npy_frame(header.as_bytes(), data)
}

/// The header dict of an array.
fn npy_header(descr: &str, fortran: bool, shape: &str) -> String {
    let order = if fortran { "True" } else { "False" };
    format!("{{'descr': '{descr}', 'fortran_order': {order}, 'shape': {shape}, }}")
}

/// A `.safetensors` file with the JSON `header` followed by `data`.
fn safetensors_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    safetensors_frame(header.as_bytes(), data)
}

/// Writes `bytes` to `name` in `dir` and returns the path as text.
fn put(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_string()
}

/// `qcandle quantize --format <format> <input> <output>`.
fn quantize_file(format: &str, input: &str, output: &str) -> Output {
    qcandle(&["quantize", "--format", format, input, output])
}

/// Asserts that a failed run left no output and no temporary file beside it.
#[track_caller]
fn assert_nothing_written(dir: &Path, inputs: usize) {
    let names: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), inputs, "left behind: {names:?}");
}

#[test]
fn an_npy_shape_whose_element_count_overflows_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let header = npy_header("<f4", false, "(4611686018427387905, 4)");
    let input = put(dir.path(), "wrapped.npy", &npy_bytes(&header, &[0; 16]));
    let output = dir.path().join("q.npy");
    let o = quantize_file("posit<8,0>", &input, output.to_str().unwrap());
    assert_clean_failure(&o, &["wrapped.npy", "overflow"]);
    assert_nothing_written(dir.path(), 1);
}

#[test]
fn an_npy_shape_larger_than_its_data_is_rejected_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("q.npy");
    let output = output.to_str().unwrap();
    for (shape, words) in [
        (
            "(100000000000,)",
            &["declares 400000000000 bytes", "holds 16"][..],
        ),
        (
            "(2305843009213693951,)",
            &["declares 9223372036854775804 bytes"][..],
        ),
        ("(4611686018427387904,)", &["overflow"][..]),
        ("(18446744073709551616,)", &["too large"][..]),
    ] {
        let header = npy_header("<f4", false, shape);
        let input = put(dir.path(), "huge.npy", &npy_bytes(&header, &[0; 16]));
        let o = quantize_file("e4m3", &input, output);
        assert_clean_failure(&o, &[&["huge.npy"][..], words].concat());
        assert!(!Path::new(output).exists());
    }
}

#[test]
fn a_negative_npy_dimension_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let header = npy_header("<f4", false, "(-1, 4)");
    let input = put(dir.path(), "neg.npy", &npy_bytes(&header, &[0; 16]));
    let o = quantize_file("e4m3", &input, &dir.path().join("q.npy").to_string_lossy());
    assert_clean_failure(&o, &["neg.npy", "negative dimension -1"]);
}

#[test]
fn unreadable_npy_element_types_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("q.npy");
    for descr in ["<c8", "|S4", "|O", "<M8[ns]"] {
        let header = npy_header(descr, false, "(1,)");
        let input = put(dir.path(), "odd.npy", &npy_bytes(&header, &[0; 8]));
        let o = quantize_file("e4m3", &input, output.to_str().unwrap());
        assert_clean_failure(&o, &["odd.npy", "unsupported element type", descr]);
    }
    let header = "{'descr': [('x', '<f4'), ('y', '<f4')], 'fortran_order': False, 'shape': (1,), }";
    let input = put(dir.path(), "rec.npy", &npy_bytes(header, &[0; 8]));
    let o = quantize_file("e4m3", &input, output.to_str().unwrap());
    assert_clean_failure(&o, &["rec.npy", "structured"]);
}

#[test]
fn big_endian_and_fortran_order_npy_are_read_as_numpy_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let logical = [[0.1f32, -2.7, 3.3], [1e-3, 5.5, -60.0]];
    let want = Tensor::new(&logical, &Device::Cpu).unwrap();
    let q = Quant::new("posit<8,0>".parse().unwrap());
    let want = quantize(&want, &q).unwrap().to_vec2::<f32>().unwrap();
    // Column after column, each value big-endian.
    let data: Vec<u8> = (0..3)
        .flat_map(|j| (0..2).map(move |i| logical[i][j]))
        .flat_map(f32::to_be_bytes)
        .collect();
    let header = npy_header(">f4", true, "(2, 3)");
    let input = put(dir.path(), "f.npy", &npy_bytes(&header, &data));
    let output = dir.path().join("q.npy");
    let o = quantize_file("posit<8,0>", &input, output.to_str().unwrap());
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&output).unwrap();
    assert_eq!(got.to_vec2::<f32>().unwrap(), want);
}

#[test]
fn npy_integer_and_bool_arrays_are_copied_in_their_own_type_and_f16_stays_f16() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("q.npy");
    let data: Vec<u8> = (0u8..24).map(|b| b.wrapping_mul(37)).collect();
    for (descr, width) in [("|i1", 1), ("<u2", 2), ("|b1", 1), ("<u8", 8), ("<i8", 8)] {
        let bytes = &data[..data.len() / width * width];
        let data = if descr == "|b1" {
            bytes.iter().map(|b| b & 1).collect()
        } else {
            bytes.to_vec()
        };
        let header = npy_header(descr, false, &format!("({},)", data.len() / width));
        let input = put(dir.path(), "ints.npy", &npy_bytes(&header, &data));
        let o = quantize_file("e4m3", &input, output.to_str().unwrap());
        assert!(o.status.success(), "{descr}: {}", stderr(&o));
        assert!(
            stdout(&o).contains("0 of 1 tensors rounded") && stdout(&o).contains("1 copied"),
            "{}",
            stdout(&o)
        );
        let written = std::fs::read(&output).unwrap();
        let text = String::from_utf8_lossy(&written[10..written.len() - data.len()]);
        assert!(
            text.contains(&format!("'descr': '{descr}'")),
            "{descr}: {text}"
        );
        assert_eq!(&written[written.len() - data.len()..], &data[..], "{descr}");
    }
    let halves: Vec<u8> = [0.1f32, 1.7, -300.0]
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let input = put(
        dir.path(),
        "h.npy",
        &npy_bytes(&npy_header("<f2", false, "(3,)"), &halves),
    );
    let o = quantize_file("posit<8,0>", &input, output.to_str().unwrap());
    assert!(o.status.success(), "{}", stderr(&o));
    let got = Tensor::read_npy(&output).unwrap();
    assert_eq!(got.dtype(), candle_core::DType::F16);
    let want = Tensor::from_raw_buffer(&halves, candle_core::DType::F16, &[3], &Device::Cpu)
        .and_then(|t| quantize(&t, &Quant::new("posit<8,0>".parse().unwrap())))
        .unwrap();
    assert_eq!(
        got.to_vec1::<half::f16>().unwrap(),
        want.to_vec1::<half::f16>().unwrap()
    );
}

#[test]
fn safetensors_sizes_that_do_not_match_the_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("q.safetensors");
    let output = output.to_str().unwrap();
    let entry = |shape: &str, end: u64| {
        format!(r#"{{"w":{{"dtype":"F32","shape":{shape},"data_offsets":[0,{end}]}}}}"#)
    };
    let mut huge_length = (1u64 << 40).to_le_bytes().to_vec();
    huge_length.extend_from_slice(b"{}");
    let cases: Vec<(Vec<u8>, &[&str])> = vec![
        (huge_length, &["declares 1099511627776 bytes", "holds 2"]),
        (
            safetensors_bytes(&entry("[1000000]", 4_000_000), &[0; 16]),
            &["truncated", "declares 4000000 bytes", "holds 16"],
        ),
        (
            safetensors_bytes(&entry("[3]", 8), &[0; 8]),
            &["`w`", "needs 12 bytes", "0..8"],
        ),
        (
            safetensors_bytes(&entry("[4611686018427387905, 4]", 16), &[0; 16]),
            &["`w`", "overflow"],
        ),
        (
            safetensors_bytes(&entry("[-1]", 4), &[0; 4]),
            &["`w`", "negative"],
        ),
        (
            safetensors_bytes(&entry("[1]", 4), &[0; 12]),
            &["8 unexpected bytes"],
        ),
        (
            {
                let mut v = safetensors_bytes(&entry("[4]", 16), &[0; 16]);
                v.truncate(v.len() - 3);
                v
            },
            &["truncated", "holds 13"],
        ),
        (vec![1, 0, 0], &["truncated", "3 bytes"]),
    ];
    for (bytes, words) in cases {
        let input = put(dir.path(), "bad.safetensors", &bytes);
        let o = quantize_file("e4m3", &input, output);
        assert_clean_failure(&o, &[&["bad.safetensors"][..], words].concat());
        assert!(!Path::new(output).exists());
    }
}

#[test]
fn a_repeated_safetensors_name_is_an_error_not_a_dropped_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("q.safetensors");
    let entry = r#""w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}"#;
    let header = format!("{{{entry},{entry}}}");
    let input = put(
        dir.path(),
        "dup.safetensors",
        &safetensors_bytes(&header, &[0; 4]),
    );
    let o = quantize_file("e4m3", &input, output.to_str().unwrap());
    assert_clean_failure(&o, &["dup.safetensors", "duplicate tensor name `w`"]);
    let header = r#"{"__metadata__":{"a":"1","a":"2"}}"#;
    let input = put(
        dir.path(),
        "meta.safetensors",
        &safetensors_bytes(header, &[]),
    );
    let o = quantize_file("e4m3", &input, output.to_str().unwrap());
    assert_clean_failure(&o, &["meta.safetensors", "duplicate", "`a`"]);
}

/// One tensor of every kind the format has that a model file may carry.
fn mixed_tensors() -> Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)> {
    let f32s: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.37 - 2.0).to_le_bytes())
        .collect();
    let f64s: Vec<u8> = (0..5)
        .flat_map(|i| (i as f64 * 1.1 - 0.3).to_le_bytes())
        .collect();
    let f16s: Vec<u8> = (0..6)
        .flat_map(|i| half::f16::from_f32(i as f32 * 0.71).to_le_bytes())
        .collect();
    let bf16s: Vec<u8> = (0..6)
        .flat_map(|i| half::bf16::from_f32(i as f32 * -1.3).to_le_bytes())
        .collect();
    let bytes = |n: usize| (0..n).map(|i| (i * 53 % 256) as u8).collect::<Vec<u8>>();
    vec![
        ("w", Dtype::F32, vec![3, 4], f32s),
        ("d", Dtype::F64, vec![5], f64s),
        ("h", Dtype::F16, vec![2, 3], f16s),
        ("b", Dtype::BF16, vec![6], bf16s),
        ("ids16", Dtype::U16, vec![4], bytes(8)),
        ("mask", Dtype::BOOL, vec![5], vec![1, 0, 0, 1, 1]),
        ("q", Dtype::I8, vec![2, 2], bytes(4)),
        ("big", Dtype::U64, vec![2], bytes(16)),
        ("fp8", Dtype::F8_E4M3, vec![3], bytes(3)),
        ("n", Dtype::I32, vec![2], bytes(8)),
    ]
}

#[test]
fn quantize_keeps_the_metadata_and_every_tensor_it_does_not_round_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let tensors = mixed_tensors();
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("qcandle.note".to_string(), "kept".to_string()),
    ]);
    let views = tensors
        .iter()
        .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()));
    let bytes = safetensors::serialize(views, Some(metadata.clone())).unwrap();
    let input = put(dir.path(), "m.safetensors", &bytes);
    let output = dir.path().join("q.safetensors");
    let o = quantize_file("e4m3", &input, output.to_str().unwrap());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("4 of 10 tensors rounded") && stdout(&o).contains("6 copied"),
        "{}",
        stdout(&o)
    );
    let written = std::fs::read(&output).unwrap();
    let got = safetensors::SafeTensors::deserialize(&written).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&written).unwrap();
    assert_eq!(header.metadata().as_ref(), Some(&metadata));
    assert_eq!(got.len(), tensors.len());
    let q = Quant::new("e4m3".parse().unwrap());
    for (name, dtype, shape, data) in &tensors {
        let view = got.tensor(name).unwrap();
        assert_eq!((view.dtype(), view.shape()), (*dtype, &shape[..]), "{name}");
        if matches!(dtype, Dtype::F16 | Dtype::BF16 | Dtype::F32 | Dtype::F64) {
            let candle = candle_core::DType::try_from(*dtype).unwrap();
            let t = Tensor::from_raw_buffer(data, candle, shape, &Device::Cpu).unwrap();
            let want = quantize(&t, &q).unwrap();
            let want: Cow<[u8]> = safetensors::View::data(&want);
            assert_eq!(view.data(), &want[..], "{name} is rounded in its own type");
            assert_ne!(view.data(), &data[..], "{name} has values e4m3 must change");
        } else {
            assert_eq!(view.data(), &data[..], "{name} is copied unchanged");
        }
    }
}

#[test]
fn metadata_an_npy_output_cannot_hold_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let views = [(
        "w",
        TensorView::new(Dtype::F32, vec![1], &[0, 0, 128, 63]).unwrap(),
    )];
    let metadata = HashMap::from([("source".to_string(), "lab".to_string())]);
    let bytes = safetensors::serialize(views, Some(metadata)).unwrap();
    let input = put(dir.path(), "m.safetensors", &bytes);
    let output = dir.path().join("w.npy");
    let o = quantize_file("e4m3", &input, output.to_str().unwrap());
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 metadata entries") && stderr(&o).contains("w.npy"),
        "{}",
        stderr(&o)
    );
}

/// The permission bits of a file.
fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn outputs_get_the_permissions_of_any_new_file() {
    let dir = tempfile::tempdir().unwrap();
    let npy = npy_bytes(
        &npy_header("<f4", false, "(2,)"),
        &[0, 0, 128, 63, 0, 0, 0, 64],
    );
    put(dir.path(), "in.npy", &npy);
    for umask in ["022", "002", "077"] {
        for output in ["out.safetensors", "out.npy"] {
            let prelude = format!("umask {umask}; rm -f ref {output}; : > ref");
            let o = qcandle_after(
                &prelude,
                Some(dir.path()),
                &["quantize", "--format", "bf16", "in.npy", output],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            let (got, want) = (
                mode(&dir.path().join(output)),
                mode(&dir.path().join("ref")),
            );
            assert_eq!(got, want, "umask {umask}, {output}: {got:o} != {want:o}");
        }
    }
}

#[test]
fn an_output_under_a_regular_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let input = put(
        dir.path(),
        "in.npy",
        &npy_bytes(&npy_header("<f4", false, "(1,)"), &[0; 4]),
    );
    put(dir.path(), "plain", b"not a directory");
    for output in ["plain/out.npy", "plain/sub/out.safetensors"] {
        let output = dir.path().join(output);
        let o = quantize_file("e4m3", &input, output.to_str().unwrap());
        let name = output.file_name().unwrap().to_str().unwrap();
        assert_clean_failure(&o, &["cannot write", name, "not a directory"]);
    }
}

#[test]
fn a_failed_write_names_the_output_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    // 16 KiB of data against a 2 KiB file size limit: the write fails with EFBIG, as it
    // would on a full disk.
    let data: Vec<u8> = (0..4096).flat_map(|i| (i as f32).to_le_bytes()).collect();
    put(
        dir.path(),
        "in.npy",
        &npy_bytes(&npy_header("<f4", false, "(4096,)"), &data),
    );
    for output in ["out.npy", "out.safetensors"] {
        let o = qcandle_after(
            "trap '' XFSZ; ulimit -f 4",
            Some(dir.path()),
            &["quantize", "--format", "bf16", "in.npy", output],
        );
        assert_clean_failure(&o, &["cannot write", output, "too large"]);
        assert_nothing_written(dir.path(), 1);
    }
}

#[test]
fn an_unreadable_input_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("q.npy");
    std::fs::create_dir(dir.path().join("in.npy")).unwrap();
    let o = quantize_file(
        "e4m3",
        &dir.path().join("in.npy").to_string_lossy(),
        output.to_str().unwrap(),
    );
    assert_clean_failure(&o, &["in.npy", "is a directory"]);
    // A named pipe would block the read until something writes to it: refused up front
    // (under `timeout`, so a blocked read fails the test instead of hanging it).
    let fifo = dir.path().join("pipe.npy");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let o = Command::new("timeout")
        .arg("20")
        .arg(BINARY)
        .args(["quantize", "--format", "e4m3"])
        .arg(&fifo)
        .arg(&output)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_clean_failure(&o, &["pipe.npy", "not a regular file"]);
}

/// A file seed for the mutation passes: header text and data, framed into a file by the
/// format's `frame` (which writes the header length), so that edits to the header alone
/// keep the length field consistent and reach the header parser.
type Seed = (Vec<u8>, Vec<u8>);

/// An `.npy` file (version 1.0) from header text and data.
fn npy_frame(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(header.len() as u16).to_le_bytes());
    v.extend_from_slice(header);
    v.extend_from_slice(data);
    v
}

/// A `.safetensors` file from header text and data.
fn safetensors_frame(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v.extend_from_slice(data);
    v
}

/// Valid `.npy` headers and data for every readable element type, byte order, storage order
/// and rank, and hand-made headers at the edges of the format.
fn npy_seeds() -> Vec<Seed> {
    let mut seeds = Vec::new();
    let types = [
        ("<f4", 4),
        ("<f8", 8),
        ("<f2", 2),
        ("|i1", 1),
        ("|u1", 1),
        ("|b1", 1),
        ("<i2", 2),
        ("<u2", 2),
        ("<i4", 4),
        ("<u4", 4),
        ("<i8", 8),
        ("<u8", 8),
        (">f4", 4),
        (">i2", 2),
    ];
    let shapes = [
        ("()", 1),
        ("(3,)", 3),
        ("(2, 3)", 6),
        ("(2, 1, 3)", 6),
        ("(0, 4)", 0),
    ];
    for (descr, width) in types {
        for (shape, count) in shapes {
            for fortran in [false, true] {
                let data: Vec<u8> = (0..width * count).map(|i| (i * 29 % 251) as u8).collect();
                let header = npy_header(descr, fortran, shape) + "     \n";
                seeds.push((header.into_bytes(), data));
            }
        }
    }
    for header in [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }",
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (6) }",
        "{'descr': [('x', '<f4'), ('y', '<i2')], 'fortran_order': False, 'shape': (1,), }",
        "{'shape': (3,), 'fortran_order': True, 'descr': '>f8'}",
        // Sizes far beyond the data, which a reader must not allocate.
        "{'descr': '<f4', 'fortran_order': False, 'shape': (100000000000,), }",
        "{'descr': '<f8', 'fortran_order': True, 'shape': (1000000, 3000000), }",
        "{'descr': '|u1', 'fortran_order': False, 'shape': (65536, 65536, 4), }",
    ] {
        seeds.push((header.as_bytes().to_vec(), vec![7; 24]));
    }
    seeds
}

/// Valid `.safetensors` headers and data: every element type alone and all together, with
/// and without metadata, and an empty file.
fn safetensors_seeds() -> Vec<Seed> {
    let tensors = mixed_tensors();
    let serialize = |subset: &[(&'static str, Dtype, Vec<usize>, Vec<u8>)], meta: bool| {
        let views = subset
            .iter()
            .map(|(n, d, s, b)| (*n, TensorView::new(*d, s.clone(), b).unwrap()));
        let metadata = meta.then(|| HashMap::from([("k".to_string(), "v".to_string())]));
        let bytes = safetensors::serialize(views, metadata).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        (bytes[8..8 + n].to_vec(), bytes[8 + n..].to_vec())
    };
    let mut seeds = vec![serialize(&tensors, true), serialize(&tensors, false)];
    for one in tensors.chunks(1) {
        seeds.push(serialize(one, false));
        seeds.push(serialize(one, true));
    }
    seeds.push(serialize(&[], false));
    seeds.push((
        br#"{"z":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]},"s":{"dtype":"U8","shape":[],"data_offsets":[0,1]}}"#.to_vec(),
        vec![9],
    ));
    // Sizes far beyond the data, which a reader must not allocate.
    seeds.push((
        br#"{"w":{"dtype":"F32","shape":[1000000000],"data_offsets":[0,4000000000]}}"#.to_vec(),
        vec![1; 16],
    ));
    seeds.push((
        br#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"F64","shape":[70000,70000],"data_offsets":[2,39200000002]}}"#.to_vec(),
        vec![1; 16],
    ));
    seeds
}

/// What a mutation pass saw.
#[derive(Default)]
struct Tally {
    tried: usize,
    parsed: usize,
    rejected: usize,
    /// The largest allocation beyond the constant allowance, per byte of input.
    worst_multiple: f64,
}

/// Bytes any parse may allocate whatever its input (messages, small tables).
const ALLOWANCE: usize = 4096;

/// Runs `check` on `count` mutated files: a framed seed edited as a whole, or its header
/// or its data edited and framed (and now and then edited again), catching panics and
/// measuring each call's largest allocation against the input's length.
fn mutation_pass(
    seeds: &[Seed],
    frame: fn(&[u8], &[u8]) -> Vec<u8>,
    count: usize,
    seed: u64,
    check: impl Fn(&[u8]) -> bool,
) -> Tally {
    let mut rng = Rng::new(seed);
    let mut tally = Tally::default();
    for _ in 0..count {
        let (header, data) = &seeds[rng.below(seeds.len())];
        let mut input = match rng.below(3) {
            0 => rng.mutate(&frame(header, data)),
            1 => frame(&rng.mutate(header), data),
            _ => frame(header, &rng.mutate(data)),
        };
        while rng.below(4) == 0 {
            input = rng.mutate(&input);
        }
        let (outcome, largest) =
            largest_allocation(|| catch_unwind(AssertUnwindSafe(|| check(&input))));
        let Ok(parsed) = outcome else {
            panic!("the parser panicked on {:02x?}", input);
        };
        assert!(
            largest <= 8 * input.len() + ALLOWANCE,
            "{largest} bytes allocated for a {}-byte input: {:02x?}",
            input.len(),
            input
        );
        let multiple = largest.saturating_sub(ALLOWANCE) as f64 / input.len().max(1) as f64;
        tally.worst_multiple = tally.worst_multiple.max(multiple);
        tally.tried += 1;
        if parsed {
            tally.parsed += 1;
        } else {
            tally.rejected += 1;
        }
    }
    tally
}

/// Checks an array a parser accepted: it holds exactly the bytes its type and shape need.
#[track_caller]
fn assert_consistent(array: &RawArray<'_>) {
    assert_eq!(
        array.data.len(),
        data_size(array.dtype, &array.shape).unwrap()
    );
}

/// Prints a pass's counts (shown with `--nocapture`) and checks it reached both outcomes.
fn report(parser: &str, tally: &Tally) {
    println!(
        "{parser}: {} mutated inputs, {} parsed, {} rejected; largest allocation beyond {ALLOWANCE} bytes: {:.2}x the input",
        tally.tried, tally.parsed, tally.rejected, tally.worst_multiple
    );
    assert!(tally.parsed > 1000 && tally.rejected > 1000);
}

#[test]
fn the_npy_parser_survives_mutated_files() {
    let tally = mutation_pass(&npy_seeds(), npy_frame, 200_000, 0x5eed_0001, |bytes| {
        let Ok(array) = npy::parse(bytes) else {
            return false;
        };
        assert_consistent(&array);
        // What was read is written back and read again unchanged.
        let again = npy::encode(&array).unwrap();
        assert_eq!(npy::parse(&again).unwrap(), array);
        true
    });
    report("npy", &tally);
}

#[test]
fn the_safetensors_parser_survives_mutated_files() {
    let seeds = safetensors_seeds();
    let tally = mutation_pass(&seeds, safetensors_frame, 200_000, 0x5eed_0002, |bytes| {
        let Ok(file) = safetensors_file::parse(bytes) else {
            return false;
        };
        file.tensors.iter().for_each(|(_, a)| assert_consistent(a));
        // The reference reader agrees on every tensor of a file this one accepts.
        let reference = safetensors::SafeTensors::deserialize(bytes).unwrap();
        assert_eq!(reference.len(), file.tensors.len());
        for (name, array) in &file.tensors {
            let view = reference.tensor(name).unwrap();
            assert_eq!(view.dtype(), array.dtype);
            assert_eq!(view.shape(), &array.shape[..]);
            assert_eq!(view.data(), &array.data[..]);
        }
        let again = safetensors_file::encode(&file).unwrap();
        let reread: RawFile<'_> = safetensors_file::parse(&again).unwrap();
        assert_eq!(reread, file);
        true
    });
    report("safetensors", &tally);
}
