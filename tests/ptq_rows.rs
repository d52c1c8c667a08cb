//! Post-training quantization rows with an accumulator format (`naive:<A>`, `fma:<A>`) and
//! LNS rows (`lns:<impl>`): a format followed by accumulate settings asks for them, each
//! row's logits equal a scalar reference that replays LeNet-5 with the same roundings (the
//! GEMM reference of `tests/accumulate_layers.rs`, biases included), and rows that cannot
//! apply are clear errors.

mod common;
#[path = "common/exact.rs"]
mod exact;
#[path = "common/gemm_reference.rs"]
mod gemm_reference;

use std::collections::HashMap;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use gemm_reference::Arith;
use qcandle::nn::{ModelKind, QConfig, Stage};
use qcandle::ptq::arith::{run_plan, RuleGemm};
use qcandle::ptq::{built, check_formats, methods, FormatRows, Method, Weights};
use qcandle::quire::Accumulate;
use qcandle::train::init_vars;
use qcandle::Format;

use common::{Mismatches, SplitMix};

type R = anyhow::Result<()>;

/// A LeNet-5 with its initial weights and biases drawn in [-0.5, 0.5] (nonzero, so every
/// layer's bias term counts).
fn lenet5(seed: u64) -> anyhow::Result<Weights> {
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
    ModelKind::Lenet5.build(vb, &QConfig::default())?;
    init_vars(&varmap, seed)?;
    let mut rng = SplitMix(seed);
    let mut tensors = HashMap::new();
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let mut t = var.as_tensor().clone();
        if name.ends_with(".bias") {
            let n = t.elem_count();
            let v: Vec<f32> = (0..n)
                .map(|_| rng.float_between(-1, 1) as f32 * 0.5)
                .collect();
            t = Tensor::from_vec(v, n, &Device::Cpu)?;
        }
        tensors.insert(name.clone(), t);
    }
    Ok(Weights {
        model: ModelKind::Lenet5,
        tensors,
        format: None,
    })
}

/// `n` images in [-1, 1].
fn images(n: usize, seed: u64) -> anyhow::Result<Tensor> {
    let (c, h, w) = ModelKind::Lenet5.input_shape();
    let v: Vec<f32> = qcandle::report::normal_samples(n * c * h * w, seed)
        .into_iter()
        .map(|x| x.clamp(-1.0, 1.0))
        .collect();
    Ok(Tensor::from_vec(v, (n, c, h, w), &Device::Cpu)?)
}

fn values(t: &Tensor) -> anyhow::Result<Vec<f32>> {
    Ok(t.flatten_all()?.to_vec1::<f32>()?)
}

/// The logits of one image (`c x h x w`, row-major) as the row computes them, written out
/// stage by stage with scalar loops: each convolution or linear output is the reference dot
/// product of its terms in the summation order (`(c, i, j)`, the input feature), the bias
/// last, every operand rounded to the row's format, held as an f32.
fn reference_logits(weights: &Weights, arith: &Arith, image: &[f32]) -> anyhow::Result<Vec<f32>> {
    let (c0, h0, w0) = ModelKind::Lenet5.input_shape();
    let mut x = image.to_vec();
    let mut shape = vec![c0, h0, w0];
    for stage in ModelKind::Lenet5.plan() {
        match stage {
            Stage::Pad { pad, value } => {
                let (c, h, w) = (shape[0], shape[1], shape[2]);
                let (ph, pw) = (h + 2 * pad, w + 2 * pad);
                let mut y = vec![value; c * ph * pw];
                for ci in 0..c {
                    for i in 0..h {
                        for j in 0..w {
                            y[(ci * ph + i + pad) * pw + j + pad] = x[(ci * h + i) * w + j];
                        }
                    }
                }
                x = y;
                shape = vec![c, ph, pw];
            }
            Stage::Conv {
                name,
                stride,
                padding,
                ..
            } => {
                assert_eq!((stride, padding), (1, 0), "LeNet-5's convolutions");
                let wt = values(weights.get(&format!("{name}.weight"))?)?;
                let b = values(weights.get(&format!("{name}.bias"))?)?;
                let (wd, bd) = (weights.get(&format!("{name}.weight"))?.dims4()?, b.len());
                let (oc, ic, kh, kw) = wd;
                assert_eq!(bd, oc);
                let (h, w) = (shape[1], shape[2]);
                let (oh, ow) = (h - kh + 1, w - kw + 1);
                let mut y = vec![0f32; oc * oh * ow];
                for o in 0..oc {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut terms = Vec::with_capacity(ic * kh * kw);
                            for ci in 0..ic {
                                for i in 0..kh {
                                    for j in 0..kw {
                                        let xv = x[(ci * h + oy + i) * w + ox + j];
                                        let wv = wt[((o * ic + ci) * kh + i) * kw + j];
                                        terms.push((arith.operand(xv), arith.operand(wv)));
                                    }
                                }
                            }
                            let bias = Some(arith.operand(b[o]));
                            y[(o * oh + oy) * ow + ox] = arith.dot(&terms, bias) as f32;
                        }
                    }
                }
                x = y;
                shape = vec![oc, oh, ow];
            }
            Stage::Linear { name, .. } => {
                let wt = values(weights.get(&format!("{name}.weight"))?)?;
                let b = values(weights.get(&format!("{name}.bias"))?)?;
                let (out, inp) = weights.get(&format!("{name}.weight"))?.dims2()?;
                assert_eq!(inp, x.len());
                let y = (0..out)
                    .map(|o| {
                        let terms: Vec<(f64, f64)> = (0..inp)
                            .map(|k| (arith.operand(x[k]), arith.operand(wt[o * inp + k])))
                            .collect();
                        arith.dot(&terms, Some(arith.operand(b[o]))) as f32
                    })
                    .collect();
                x = y;
                shape = vec![out];
            }
            Stage::Relu => x.iter_mut().for_each(|v| *v = v.max(0.0)),
            Stage::MaxPool(k) => {
                let (c, h, w) = (shape[0], shape[1], shape[2]);
                let (oh, ow) = (h / k, w / k);
                let mut y = vec![f32::NEG_INFINITY; c * oh * ow];
                for ci in 0..c {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let m = &mut y[(ci * oh + oy) * ow + ox];
                            for i in 0..k {
                                for j in 0..k {
                                    *m = m.max(x[(ci * h + oy * k + i) * w + ox * k + j]);
                                }
                            }
                        }
                    }
                }
                x = y;
                shape = vec![c, oh, ow];
            }
            Stage::Flatten => shape = vec![x.len()],
            other => panic!("LeNet-5 has no stage {other:?}"),
        }
    }
    Ok(x)
}

/// Checks that the row `format setting` of LeNet-5 gives the reference logits on `n` images.
fn check_row(weights: &Weights, format: &str, setting: &str, n: usize) -> R {
    let f = gemm_reference::fmt(format);
    let accumulate: Accumulate = setting.parse()?;
    let arith = RuleGemm::new(weights, f, accumulate)?;
    let x = images(n, 7)?;
    let logits = run_plan(ModelKind::Lenet5, &arith, &x, |_, _| Ok(()))?;
    let got = logits.to_vec2::<f32>()?;
    let reference = Arith::new(setting, f);
    let mut m = Mismatches::default();
    for (i, row) in got.iter().enumerate() {
        let image = values(&x.get(i)?)?;
        let want = reference_logits(weights, &reference, &image)?;
        for (class, (&g, &w)) in row.iter().zip(&want).enumerate() {
            // ReLU may leave a zero of either sign; a logit is a value.
            m.check(g == w || (g.is_nan() && w.is_nan()), || {
                format!("{format} {setting} image {i} class {class}: got {g:e}, want {w:e}")
            });
        }
        assert!(
            want.iter().any(|&v| v != want[0]),
            "{format} {setting}: the logits of image {i} are all equal ({want:?}): a weak check"
        );
    }
    assert_eq!(m.count, 0, "{:#?}", m.first);
    Ok(())
}

#[test]
fn accumulator_format_rows_equal_the_scalar_reference_of_lenet5() -> R {
    let weights = lenet5(3)?;
    for (format, setting) in [
        ("e4m3", "naive:fp16"),
        ("e4m3", "fma:fp32"),
        ("e5m2", "naive:bf16"),
        ("posit<8,0>", "naive:fp16"),
        ("posit<8,0>", "fma:fp16"),
    ] {
        check_row(&weights, format, setting, 2)?;
    }
    Ok(())
}

#[test]
fn lns_rows_equal_the_scalar_reference_of_lenet5() -> R {
    let weights = lenet5(4)?;
    for (format, setting) in [
        ("lns<8,3>", "lns:ideal"),
        ("lns<8,3>", "lns:table"),
        ("lns<12,6>", "lns:truncated"),
        ("lns<16,10>", "lns:table"),
    ] {
        check_row(&weights, format, setting, 2)?;
    }
    Ok(())
}

fn rows(specs: &[&str]) -> anyhow::Result<Vec<FormatRows>> {
    specs.iter().map(|s| s.parse()).collect()
}

fn names(methods: &[Method]) -> Vec<String> {
    methods.iter().map(Method::to_string).collect()
}

#[test]
fn a_format_with_settings_gives_one_row_per_setting_and_a_bare_lns_format_ideal_and_table() -> R {
    let specs = rows(&[
        "posit<8,0> naive quire naive:fp16",
        "e4m3 fma:fp32 naive",
        "lns<8,3>",
        "lns<12,6> lns:truncated",
        "mxfp8_e4m3",
    ])?;
    check_formats(&specs)?;
    let m = methods(&specs);
    assert_eq!(
        names(&m),
        [
            "float32",
            "float16",
            "int8",
            "posit<8,0> naive",
            "posit<8,0> quire",
            "posit<8,0> naive:fp16",
            "e4m3 fma:fp32",
            "e4m3 naive",
            "lns<8,3> lns:ideal",
            "lns<8,3> lns:table",
            "lns<12,6> lns:truncated",
            "mxfp8_e4m3 f32",
        ]
    );
    // naive and quire are the posit GEMMs of the existing rows; the others are rules.
    assert!(matches!(m[3], Method::Format { .. }));
    assert!(matches!(
        m[5],
        Method::Rule {
            accumulate: Accumulate::NaiveSum(_),
            ..
        }
    ));
    assert!(matches!(m[11], Method::BlockScaled { .. }));
    // The transformer's rows: one config per setting given; the defaults otherwise.
    let (built, _) = built::methods(&rows(&["bf16 naive:fp32 fma:fp32", "lns<12,6>"])?);
    assert_eq!(
        names(&built),
        [
            "float32",
            "float16",
            "bf16 naive:fp32",
            "bf16 fma:fp32",
            "lns<12,6> f32",
            "lns<12,6> lns:ideal",
            "lns<12,6> lns:table",
        ]
    );
    Ok(())
}

#[test]
fn a_row_spec_reads_back_from_its_text_and_malformed_specs_are_errors() -> R {
    for text in [
        "e4m3",
        "e4m3 naive:fp16 fma:bf16",
        "e5m2 naive:fp32 fma:fp32",
        "posit<8,0> naive quire",
        "lns<8,3> lns:ideal lns:table:1:2",
    ] {
        let spec: FormatRows = text.parse()?;
        assert_eq!(spec.to_string(), text);
        assert_eq!(spec.to_string().parse::<FormatRows>()?, spec);
    }
    let spec: FormatRows = "  e5m2   naive:fp16 ".parse()?;
    assert_eq!(spec.format, "e5m2".parse::<Format>()?);
    assert_eq!(spec.settings, [Accumulate::NaiveSum("fp16".parse()?)]);
    for (text, needle) in [
        ("", "empty"),
        ("e4m3 naive:fp16 naive:fp16", "asked for twice"),
        ("e4m3 sum:fp16", "expected one of"),
        ("e4m3 fma", "needs an accumulator format"),
        ("notaformat naive", "notaformat"),
    ] {
        let err = text.parse::<FormatRows>().unwrap_err();
        assert!(format!("{err:#}").contains(needle), "{text}: {err:#}");
    }
    Ok(())
}

#[test]
fn rows_that_cannot_apply_are_errors_naming_why() -> R {
    for (text, needle) in [
        ("e4m3 quire", "quire needs a posit format"),
        ("lns<8,3> naive", "logarithmic"),
        ("lns<8,3> naive:fp16", "logarithmic"),
        ("e4m3 lns:ideal", "needs an lns format"),
        ("e4m3 f32", "f32 rows"),
        ("mxfp8_e4m3 naive:fp16", "rounds whole blocks"),
        ("e4m3 naive:mxfp8_e4m3", "rounds whole blocks"),
        ("posit<32,2> fma:fp32", "products exact"),
        ("posit<32,5> naive:fp32", "quire"),
        ("fixed<8,4,noclamp> naive:fp16", "cannot be saved"),
    ] {
        let err = check_formats(&rows(&[text])?).unwrap_err();
        assert!(format!("{err:#}").contains(needle), "{text}: {err:#}");
    }
    let err = check_formats(&rows(&["e4m3", "e4m3 naive:fp16"])?).unwrap_err();
    assert!(
        format!("{err:#}").contains("given more than once"),
        "{err:#}"
    );
    // The arithmetic itself refuses what check_formats refuses, without a panic.
    let weights = lenet5(1)?;
    for (format, setting) in [("e4m3", "f32"), ("e4m3", "quire"), ("lns<8,3>", "naive")] {
        let Err(e) = RuleGemm::new(&weights, format.parse()?, setting.parse()?) else {
            panic!("{format} {setting} accepted");
        };
        assert!(e.to_string().contains(format), "{e}");
    }
    Ok(())
}
