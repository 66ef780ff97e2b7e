//! Host↔device copies through the real driver, for the team examples'
//! `--driver cuda` runs: `cuMemcpyHtoD_v2` / `cuMemcpyDtoH_v2` in the
//! device's primary context (retained, made current, the previous context
//! restored, released). The library itself never copies memory; a program
//! beside it does, as this one. On the libcuda test double the bytes land
//! in the model's memory (on a model fabric, the fabric's).

use std::ffi::{c_int, c_void};

use libloading::Library;

type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> u32;
type Release = unsafe extern "C" fn(c_int) -> u32;
type GetCurrent = unsafe extern "C" fn(*mut *mut c_void) -> u32;
type SetCurrent = unsafe extern "C" fn(*mut c_void) -> u32;
type HtoD = unsafe extern "C" fn(u64, *const c_void, usize) -> u32;
type DtoH = unsafe extern "C" fn(*mut c_void, u64, usize) -> u32;

/// The driver's copy calls, resolved once.
pub struct Copies {
    retain: Retain,
    release: Release,
    get_current: GetCurrent,
    set_current: SetCurrent,
    htod: HtoD,
    dtoh: DtoH,
    /// Keeps the symbols above valid.
    _lib: Library,
}

fn failed(call: &str, rc: u32) -> Box<dyn std::error::Error> {
    format!("{call} failed with CUresult {rc}").into()
}

impl Copies {
    /// Resolves the calls in `libcuda.so.1` (the library the backend loaded).
    pub fn load() -> Result<Copies, Box<dyn std::error::Error>> {
        // SAFETY: loading libcuda runs its initialisers, which a driver
        // library expects; the backend has loaded it already.
        let lib = unsafe { Library::new("libcuda.so.1") }?;
        // SAFETY: each name is resolved with its `cuda.h` prototype.
        unsafe {
            Ok(Copies {
                retain: *lib.get::<Retain>(b"cuDevicePrimaryCtxRetain\0")?,
                release: *lib.get::<Release>(b"cuDevicePrimaryCtxRelease_v2\0")?,
                get_current: *lib.get::<GetCurrent>(b"cuCtxGetCurrent\0")?,
                set_current: *lib.get::<SetCurrent>(b"cuCtxSetCurrent\0")?,
                htod: *lib.get::<HtoD>(b"cuMemcpyHtoD_v2\0")?,
                dtoh: *lib.get::<DtoH>(b"cuMemcpyDtoH_v2\0")?,
                _lib: lib,
            })
        }
    }

    /// Runs `f` with `dev`'s primary context current on this thread.
    fn in_context(
        &self,
        dev: i32,
        f: impl FnOnce() -> u32,
    ) -> Result<u32, Box<dyn std::error::Error>> {
        let (mut ctx, mut prev) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; `dev` is checked by the driver.
        let rc = unsafe { (self.retain)(&mut ctx, dev) };
        if rc != 0 {
            return Err(failed("cuDevicePrimaryCtxRetain", rc));
        }
        // SAFETY: a valid out-pointer, then the context just retained.
        let rc = unsafe {
            let rc = (self.get_current)(&mut prev);
            if rc == 0 { (self.set_current)(ctx) } else { rc }
        };
        let out = if rc == 0 {
            Ok(f())
        } else {
            Err(failed("cuCtxSetCurrent", rc))
        };
        // SAFETY: the previous context back (null: none), then the
        // reference taken above dropped.
        unsafe {
            (self.set_current)(prev);
            (self.release)(dev);
        }
        out
    }

    /// Copies `bytes` to device address `ptr`, mapped for `dev`.
    pub fn write(
        &self,
        dev: i32,
        ptr: u64,
        bytes: &[u8],
    ) -> Result<(), Box<dyn std::error::Error>> {
        // SAFETY: `bytes` is readable for its length.
        let rc = self.in_context(dev, || unsafe {
            (self.htod)(ptr, bytes.as_ptr().cast(), bytes.len())
        })?;
        if rc == 0 {
            Ok(())
        } else {
            Err(failed("cuMemcpyHtoD", rc))
        }
    }

    /// Copies `len` bytes from device address `ptr`, mapped for `dev`.
    pub fn read(
        &self,
        dev: i32,
        ptr: u64,
        len: usize,
    ) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
        let mut out = vec![0u8; len];
        // SAFETY: `out` is writable for `len` bytes.
        let rc = self.in_context(dev, || unsafe {
            (self.dtoh)(out.as_mut_ptr().cast(), ptr, len)
        })?;
        if rc == 0 {
            Ok(out)
        } else {
            Err(failed("cuMemcpyDtoH", rc))
        }
    }
}
