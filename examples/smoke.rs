use qcandle::format::rounding::NearestEven;
use qcandle::format::*;
fn main() {
    let p = Posit::new(8, 0).unwrap();
    let sp = |x: f32| softposit::P8E0::from_f32(x).to_f32();
    let _ = sp;
    let f16f = Float::new(5, 10).unwrap();
    let mut bad = 0u64;
    let mut rng = 12345u64;
    for i in 0..2_000_000u64 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let x = f32::from_bits((rng >> 32) as u32);
        if !x.is_finite() { continue; }
        let a = f16f.round(x as f64, NearestEven, 0) as f32;
        let b = half::f16::from_f32(x).to_f32();
        if a.to_bits() != b.to_bits() { bad += 1; if bad < 5 { println!("f16 {x:e}: {a:e} vs {b:e}"); } }
        let a = p.round(x as f64, NearestEven, 0) as f32;
        let b = softposit::P8E0::from_f32(x).to_f32();
        if a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan()) && !(a == 0.0 && b == 0.0) { bad += 1; if bad < 10 { println!("p8 {x:e}: {a:e} vs {b:e}"); } }
        let p16 = Posit::new(16,1).unwrap();
        let a = p16.round(x as f64, NearestEven, 0) as f32;
        let b = softposit::PxE1::<16>::from_f32(x).to_f32();
        if a.to_bits() != b.to_bits() && !(a == 0.0 && b == 0.0) { bad += 1; if bad < 15 { println!("p16 {x:e}: {a:e} vs {b:e}"); } }
        let _ = i;
    }
    println!("bad {bad}");
}
