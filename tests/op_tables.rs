//! `OpTables::pattern` (the look-up of an operand's bit pattern by its f32's top bits)
//! against `OpTables::encode` for every value of each 8-bit table format and for values off
//! the grid: ±0, NaN, ±Inf, values between neighbours, beyond the range and below it.

use qcandle::format::Format;
use qcandle::quire::gemm_cpu::OpTables;

#[test]
fn pattern_equals_encode_on_and_off_the_grid() {
    for name in [
        "posit<8,0>",
        "posit<8,2>",
        "posit<6,1>",
        "e4m3",
        "e5m2",
        "float<3,4>",
    ] {
        let f: Format = name.parse().expect("format");
        let Some(t) = OpTables::get(&f) else {
            continue;
        };
        let mut xs: Vec<f64> = t.decode.to_vec();
        for p in 0..256 {
            let v = t.decode[p];
            xs.extend([
                v * (1.0 + 1e-9),
                v * (1.0 - 1e-9),
                v * 1.01,
                v / 3.0,
                -v,
                v * 1e30,
            ]);
        }
        xs.extend([
            0.0,
            -0.0,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e-300,
            -1e-300,
            1e300,
        ]);
        for x in xs {
            let (got, want) = (t.pattern(x), t.encode(x));
            assert_eq!(got, want, "{name}: {x:e}");
        }
    }
}
