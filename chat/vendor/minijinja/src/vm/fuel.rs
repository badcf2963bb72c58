use crate::compiler::instructions::Instruction;
use crate::error::{Error, ErrorKind};

use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Arc;

/// Helper for tracking fuel consumption
pub struct FuelTracker {
    // The initial fuel level.
    initial: u64,
    // This should be an AtomicI64 but sadly 32bit targets do not necessarily have
    // AtomicI64 available.
    remaining: AtomicIsize,
}

impl FuelTracker {
    /// Creates a new fuel tracker.
    ///
    /// The fuel tracker is always wrapped in an `Arc` so that it can be
    /// shared across nested invocations of the template evaluation.
    pub fn new(fuel: u64) -> Arc<FuelTracker> {
        Arc::new(FuelTracker {
            initial: fuel,
            remaining: AtomicIsize::new(fuel as isize),
        })
    }

    /// Tracks an instruction.  If it runs out of fuel an error is returned.
    pub fn track(&self, instr: &Instruction) -> Result<(), Error> {
        let fuel_to_consume = fuel_for_instruction(instr);
        if fuel_to_consume != 0 {
            let old_fuel = self.remaining.fetch_sub(fuel_to_consume, Ordering::Relaxed);
            if old_fuel - fuel_to_consume <= 0 {
                return Err(Error::from(ErrorKind::OutOfFuel));
            }
        }
        Ok(())
    }

    /// Consumes `amount` fuel at once (hypura patch: values built by
    /// operators and emitted text are charged by size, see
    /// [`fuel_for_size`]).  If it runs out of fuel an error is returned.
    pub fn consume(&self, amount: u64) -> Result<(), Error> {
        if amount == 0 {
            return Ok(());
        }
        let amount = isize::try_from(amount).unwrap_or(isize::MAX);
        let old_fuel = self.remaining.fetch_sub(amount, Ordering::Relaxed);
        if old_fuel.saturating_sub(amount) <= 0 {
            self.remaining.store(0, Ordering::Relaxed);
            return Err(Error::from(ErrorKind::OutOfFuel));
        }
        Ok(())
    }

    /// Returns the remaining fuel.
    pub fn remaining(&self) -> u64 {
        self.remaining.load(Ordering::Relaxed) as _
    }

    /// Returns the consumed fuel.
    pub fn consumed(&self) -> u64 {
        self.initial.saturating_sub(self.remaining())
    }
}

/// Bytes of text that cost one unit of fuel (hypura patch).
pub const BYTES_PER_FUEL: usize = 16;

/// Fuel for a value an operator built or text written to the output
/// (hypura patch): one unit per [`BYTES_PER_FUEL`] bytes of a string, one
/// per item of a sized sequence, so a template cannot grow memory faster
/// than its fuel allows (`s ~ s` doubling, `[x] * n`, long raw text in a loop).
pub fn fuel_for_size(value: &crate::value::Value) -> u64 {
    if let Some(text) = value.as_str() {
        return (text.len() / BYTES_PER_FUEL) as u64;
    }
    match value.kind() {
        crate::value::ValueKind::Seq | crate::value::ValueKind::Iterable => {
            value.len().unwrap_or(0) as u64
        }
        _ => 0,
    }
}

/// How much fuel does an instruction consume?
fn fuel_for_instruction(instruction: &Instruction) -> isize {
    match instruction {
        Instruction::BeginCapture(_)
        | Instruction::PushLoop(_)
        | Instruction::PushDidNotIterate
        | Instruction::PushWith
        | Instruction::PopFrame
        | Instruction::PopLoopFrame
        | Instruction::DupTop
        | Instruction::DiscardTop
        | Instruction::PushAutoEscape
        | Instruction::PopAutoEscape => 0,
        #[cfg(feature = "multi_template")]
        Instruction::ExportLocals => 0,
        #[cfg(feature = "macros")]
        Instruction::LoadBlocks | Instruction::BuildMacro(..) | Instruction::Return => 0,
        _ => 1,
    }
}
