//! Which vector instruction set the CPU kernels run: the best the CPU has, or less where a
//! cap says so.
//!
//! The vectorised passes are compiled three times (portable, AVX2, AVX-512 F/BW/DQ/VL) and
//! chosen at run time. Every compiled path gives the same bits (integer operations, or
//! floating-point estimates whose undecided cases go to the exact scalar rounding), which
//! the tests check by running the kernels under each cap ([`set_cap`]) on a CPU that has
//! the wider sets.

use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction set the CPU kernels are compiled for, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// The target's baseline (SSE2 on x86-64).
    Portable,
    /// AVX2 (256-bit integer vectors, gathers) with FMA.
    Avx2,
    /// AVX-512 F, BW, DQ and VL.
    Avx512,
}

impl Isa {
    /// Every instruction set, narrowest first.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];
}

/// The widest instruction set the kernels may use (`u8::MAX`: no cap).
static CAP: AtomicU8 = AtomicU8::new(u8::MAX);

/// Caps the instruction set the CPU kernels choose, process-wide (`None` lifts the cap).
/// For tests and comparisons of the compiled paths, which give the same bits.
pub fn set_cap(cap: Option<Isa>) {
    CAP.store(cap.map_or(u8::MAX, |isa| isa as u8), Ordering::Relaxed);
}

/// The widest instruction set this CPU supports.
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            return Isa::Avx512;
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Isa::Avx2;
        }
    }
    Isa::Portable
}

/// The instruction set the kernels use now: [`detected`], at most the cap.
#[inline(always)]
pub fn active() -> Isa {
    let cap = CAP.load(Ordering::Relaxed);
    let isa = detected();
    if (isa as u8) <= cap {
        isa
    } else {
        Isa::ALL[cap as usize]
    }
}
