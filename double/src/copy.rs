//! `cuFabricCpyBatchAsync` (13.5+, SPEC F1-F9). Absent from the
//! `cuda-13000` build, as from driver 580's symbol table; on a build that
//! pretends to be older than 13.5 (`CUDA_DOUBLE_VERSION`) it answers
//! `NOT_SUPPORTED` (F7) and `cuGetProcAddress` says "not found".
//!
//! Each `CUDA_FABRIC_COPY_BATCH_OP` is read with the C layout and turned
//! into the model's [`CopyOp`]. A pointer operand's `locHint` is the
//! caller's word, read as [`MemHint`] says, with unified addressing first:
//! an address in a virtual range this process reserved is CUDA's (device
//! or mapped host-NUMA memory) even when hinted host, and the model
//! resolves it; outside those ranges, only an operand hinted
//! `CU_MEM_LOCATION_TYPE_HOST` is host memory the caller vouched for
//! (which the model reads or writes when the stream reaches the op); any
//! other address is refused by the model (F2), never dereferenced.

use std::ffi::c_ulonglong;

use cuda_endpoints::Device;
use cuda_endpoints::driver::{CopyOp, CopyOps, MemHint, Operand, Pointer};

use crate::abi::*;
use crate::state::{self, INVALID_VALUE, NOT_SUPPORTED};
use crate::stream::handle;
use crate::{model, read};

use crate::ffi::{
    CU_FABRIC_COPY_OPERAND_TYPE_LOGICAL_ENDPOINT as OPERAND_LOGICAL_ENDPOINT,
    CU_FABRIC_COPY_OPERAND_TYPE_POINTER as OPERAND_POINTER,
    CU_MEM_LOCATION_TYPE_DEVICE as LOC_DEVICE, CU_MEM_LOCATION_TYPE_HOST as LOC_HOST,
    CU_MEM_LOCATION_TYPE_HOST_NUMA as LOC_HOST_NUMA, CU_MEM_LOCATION_TYPE_INVALID as LOC_INVALID,
};
/// The most ops of one batch the double reads (a longer list is refused
/// rather than allocated for).
const MAX_OPS: usize = 1 << 20;
const CALL: &str = "cuFabricCpyBatchAsync";

fn bad(rule: &str) -> CUresult {
    state::with(|d| d.violate(CALL, rule, INVALID_VALUE))
}

/// One operand of `size` bytes as the model's [`Operand`].
fn operand(o: &CUfabricCpyOperand, size: u64) -> Result<Operand, CUresult> {
    match o.type_ {
        OPERAND_POINTER => {
            // SAFETY: `type` says the `ptr` member is the one written; both
            // members are plain integers, any bit pattern is valid.
            let p = unsafe { o.op.ptr };
            let hint = match p.locHint.type_ {
                LOC_INVALID => MemHint::None,
                LOC_DEVICE => MemHint::Device(Device(p.locHint.id)),
                LOC_HOST => MemHint::Host,
                LOC_HOST_NUMA => MemHint::HostNuma(p.locHint.id),
                _ => return Err(bad("double: unsupported locHint type")),
            };
            // Unified addressing first: CUDA's address range is never host
            // memory, whatever the hint says.
            let hint = if hint == MemHint::Host && state::with(|d| d.in_device_va(p.ptr, size)) {
                MemHint::None
            } else {
                hint
            };
            if hint == MemHint::Host && p.ptr == 0 && size > 0 {
                return Err(INVALID_VALUE);
            }
            Ok(Operand::Pointer(Pointer { ptr: p.ptr, hint }))
        }
        OPERAND_LOGICAL_ENDPOINT => {
            // SAFETY: as above, for the `le` member.
            let le = unsafe { o.op.le };
            Ok(Operand::LogicalEndpoint {
                id: le.id,
                offset: le.offset,
            })
        }
        _ => Err(bad("F1")),
    }
}

crate::abi::exports! {
    [13050] fn cuFabricCpyBatchAsync(
        num_ops: size_t,
        op_list: *mut CUDA_FABRIC_COPY_BATCH_OP,
        flags: c_ulonglong,
        h_stream: CUstream,
    ) {
        if state::with(|d| d.version) < 13050 {
            // F7: no such call before 13.5.
            return Err(NOT_SUPPORTED);
        }
        state::with(|d| d.stream_context(CALL, handle(h_stream), true))?;
        if num_ops > MAX_OPS || (op_list.is_null() && num_ops > 0) {
            return Err(INVALID_VALUE);
        }
        let mut ops = CopyOps::with_capacity(num_ops);
        for i in 0..num_ops {
            // `cuda.h`: `opList` holds `numOps` ops (read, never written).
            let op = read(op_list.cast_const().wrapping_add(i))?;
            if op.flags != 0 {
                return Err(bad("F5"));
            }
            let size = op.size as u64;
            ops.push(CopyOp {
                src: operand(&op.src, size)?,
                dst: operand(&op.dst, size)?,
                size,
            });
        }
        // SAFETY: the model only simulates; the double is its sole user.
        // Host operands are the caller's word (the row's contract).
        model(|m| unsafe { m.fabric_copy_batch(handle(h_stream), ops, flags) })
    }
}
