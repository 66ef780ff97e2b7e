//! The ABI check: [`c_source`] prints the declarations of [`ffi`](super::ffi)
//! back as a C file that includes the real `cuda.h` and asserts, at compile
//! time, that they agree with it: typedef sizes and signedness, struct sizes
//! and field offsets, enum values, and every function prototype (the
//! header's function assigned to a pointer of the type declared here, which
//! `-Werror=incompatible-pointer-types` turns into an error on any
//! mismatch). Items a header version lacks are guarded by `CUDA_VERSION`.
//!
//! `ci/abi-check.sh` writes the file (`cargo test --lib -- --ignored
//! write_abi_check`) and compiles it with gcc against the 13.3, 13.4 and
//! 13.5 headers.
//!
//! One C ABI: the libcuda test double (`double/`) compiles this file and
//! `ffi.rs` as its own modules (`#[path]`), so its types are these, and its
//! check ([`declarations`] plus its exports' prototypes) is this one. So this
//! file names nothing of the library beyond `super::ffi`; the library's
//! `CUresult` names are added by `super::c_source`.

use std::fmt::Write as _;

use super::ffi::{CONSTS, FUNCTIONS, NESTED, STRUCTS, TYPEDEFS};

/// A Rust type as the tokens `stringify!` gave it (`*const CUlogicalEndpointProp`,
/// `c_int`, `usize`...) in C (`const CUlogicalEndpointProp *`, `int`, `size_t`).
/// Names that are not Rust primitives are `cuda.h` typedefs and stay as they are.
pub fn c_type(rust: &str) -> String {
    let t = rust.trim().replace("* ", "*");
    let t = t.as_str();
    if let Some(rest) = t.strip_prefix("*const") {
        return format!("const {} *", c_type(rest));
    }
    if let Some(rest) = t.strip_prefix("*mut") {
        return format!("{} *", c_type(rest));
    }
    match t {
        "c_void" => "void",
        "c_int" | "i32" => "int",
        "c_uint" | "u32" => "unsigned int",
        "c_uchar" | "u8" => "unsigned char",
        "c_char" => "char",
        "c_ushort" | "u16" => "unsigned short",
        "c_ulonglong" => "unsigned long long",
        "usize" => "size_t",
        other => other,
    }
    .to_owned()
}

/// `body`, inside `#if CUDA_VERSION >= since` when older headers lack it.
pub fn guarded(out: &mut String, since: u32, body: impl FnOnce(&mut String)) {
    if since > 12000 {
        let _ = writeln!(out, "#if CUDA_VERSION >= {since}");
        body(out);
        let _ = writeln!(out, "#endif");
    } else {
        body(out);
    }
}

/// The head of a check file: the includes and `CHECK`.
pub const HEAD: &str = "/* Generated from the Rust declarations in src/driver/cuda/ffi.rs\n\
     * (src/driver/cuda/abi.rs). Compiles only if they agree with this cuda.h. */\n\
     #include <stddef.h>\n\
     #include <cuda.h>\n\n\
     #define CHECK(cond, what) _Static_assert(cond, what)\n\n";

/// The checks of every declaration of `ffi.rs`, to follow [`HEAD`]: the
/// C file is `HEAD + declarations()`, compiled with
/// `gcc -fsyntax-only -Werror=incompatible-pointer-types -I<cuda include>`.
pub fn declarations() -> String {
    let mut out = String::new();
    out.push_str("/* typedefs: size and signedness */\n");
    for t in TYPEDEFS {
        let _ = writeln!(
            out,
            "CHECK(sizeof({0}) == {1}, \"size of {0}\");",
            t.name, t.size
        );
        if let Some(signed) = t.signed {
            // `< 1`, not `< 0`: no `-Wtype-limits` warning for unsigned types.
            let _ = writeln!(
                out,
                "CHECK((({0})-1 < ({0})1) == {1}, \"signedness of {0}\");",
                t.name,
                u8::from(signed)
            );
        }
    }
    out.push_str("\n/* structs: size and field offsets */\n");
    for s in STRUCTS.iter().chain(NESTED) {
        guarded(&mut out, s.since, |out| {
            let _ = writeln!(
                out,
                "CHECK(sizeof({0}) == {1}, \"size of {0}\");",
                s.name, s.size
            );
            for f in s.fields {
                let _ = writeln!(
                    out,
                    "CHECK(offsetof({0}, {1}) == {2}, \"offset of {0}.{1}\");",
                    s.name, f.path, f.offset
                );
                let _ = writeln!(
                    out,
                    "CHECK(sizeof((({0} *)0)->{1}) == {2}, \"size of {0}.{1}\");",
                    s.name, f.path, f.size
                );
            }
        });
    }
    out.push_str("\n/* enum values */\n");
    for c in CONSTS {
        guarded(&mut out, c.since, |out| {
            let _ = writeln!(out, "CHECK({0} == {1}, \"value of {0}\");", c.name, c.value);
        });
    }
    out.push_str("\n/* prototypes: the header's function as a pointer of our type */\n");
    for f in FUNCTIONS {
        guarded(&mut out, f.since, |out| {
            let params: Vec<String> = f.params.iter().map(|p| c_type(p)).collect();
            let params = if params.is_empty() {
                "void".to_owned()
            } else {
                params.join(", ")
            };
            let _ = writeln!(
                out,
                "CUresult (*const check_{0})({1}) = &{0};",
                f.name, params
            );
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_types_print_as_c() {
        assert_eq!(
            c_type("*const CUlogicalEndpointProp"),
            "const CUlogicalEndpointProp *"
        );
        assert_eq!(c_type("*mut c_int"), "int *");
        assert_eq!(c_type("* mut CUcontext"), "CUcontext *");
        assert_eq!(c_type("usize"), "size_t");
        assert_eq!(c_type("c_ulonglong"), "unsigned long long");
        assert_eq!(c_type("cuuint64_t"), "cuuint64_t");
    }

    #[test]
    fn the_check_covers_every_declaration() {
        let src = declarations();
        for f in FUNCTIONS {
            assert!(src.contains(&format!("= &{};", f.name)), "{}", f.name);
        }
        for s in STRUCTS {
            assert!(src.contains(&format!("sizeof({})", s.name)), "{}", s.name);
        }
        for c in CONSTS {
            assert!(src.contains(&format!("CHECK({} ==", c.name)), "{}", c.name);
        }
        assert!(
            src.contains(
                "#if CUDA_VERSION >= 13040\nCUresult (*const check_cuDeviceGetCliqueInfo)"
            )
        );
        assert!(src.contains(
            "check_cuLogicalEndpointCreate)(CUlogicalEndpointId, const CUlogicalEndpointProp *)"
        ));
    }
}
