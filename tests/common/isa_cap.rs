//! Running a kernel under each instruction set this CPU has (`backend::isa::set_cap`): the
//! cap is process-wide, so the tests that set it hold [`CAP`] while they do.

use std::sync::Mutex;

use qcandle::backend::isa::{self, Isa};

/// Held while a test sets the instruction-set cap.
pub static CAP: Mutex<()> = Mutex::new(());

/// The instruction sets this CPU can run, narrowest first.
pub fn available() -> Vec<Isa> {
    let isas: Vec<Isa> = Isa::ALL
        .into_iter()
        .filter(|&isa| isa <= isa::detected())
        .collect();
    if isas.len() < Isa::ALL.len() {
        eprintln!("only {isas:?} on this CPU: the wider paths are not exercised");
    }
    isas
}

/// Runs `f` under each instruction set this CPU has, holding [`CAP`]; the cap is lifted
/// afterwards.
#[allow(dead_code)] // each test file uses part of it
pub fn on_every_isa(mut f: impl FnMut(Isa)) {
    let _guard = CAP.lock().unwrap_or_else(|e| e.into_inner());
    for isa in available() {
        isa::set_cap(Some(isa));
        f(isa);
    }
    isa::set_cap(None);
}
