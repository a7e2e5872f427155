//! Issue 44, item 4: every function of `include/reservoir.h`, called from C
//! and from C++ with edge arguments, answers a status and never crashes.
//!
//! The test parses every function declaration of the header (name, return
//! type, parameter types) and the function-pointer typedefs, and writes a
//! program that calls each function once per argument profile:
//!
//! * `zero`: null pointers, 0, false, 0.0, a null handle;
//! * `max`: null pointers, -1 for signed and the maximum for unsigned
//!   integers, true, NaN, a destroyed handle;
//! * `buffers`: out-pointers to zeroed scratch buffers, strings `""`, 0,
//!   true, -1.0, a forged handle (right magic, never created);
//! * `live`: a live simulated-device handle, scratch buffers, 0, -inf;
//! * `live-max`: a live handle, null pointers, the type's maximum for every
//!   integer, true, +inf.
//!
//! Pointers the callee would own or dereference as an object of its own
//! (`void *` device pointers and streams, checkpoints, buffers to free) are
//! always null: anything else would break the documented contract, not
//! test it. A function taking a handle gets a fresh live handle in the
//! live profiles (so `reservoir_allocator_destroy` does not end the others').
//!
//! The program checks that every status-returning call answers a
//! `ReservoirStatus` other than `RESERVOIR_ERR_PANIC` and
//! `RESERVOIR_ERR_POISONED`, and that no last error says "panicked"; it
//! prints `capi-header-calls: N calls, F failed`. It is compiled with
//! `-Wall -Wextra -Werror` as C11 (gcc, against the cdylib) and as C++17
//! (g++, against the staticlib), and run; the `reservoir_torch_*` calls
//! reach the CUDA driver when one loads (the fake driver:
//! `LD_LIBRARY_PATH=$HOME/.cache/pytorch-oracle/lib`), else they answer
//! `RESERVOIR_ERR_BACKEND_UNAVAILABLE` and the test prints a
//! `SKIPPED-BACKEND` line.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One function declaration of the header.
#[derive(Debug)]
struct Function {
    ret: String,
    name: String,
    params: Vec<(String, String)>,
}

/// The header without comments and preprocessor lines, on one line per
/// declaration (split at `;`).
fn declarations(header: &str) -> Vec<String> {
    let code: String = header
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#'))
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join(" ");
    code.split(';')
        .map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|d| !d.is_empty())
        .collect()
}

/// The function-pointer typedefs (`typedef R (*NAME)(...)`) of the header.
fn fn_pointer_typedefs(header: &str) -> Vec<String> {
    declarations(header)
        .iter()
        .filter_map(|d| {
            let rest = d.strip_prefix("typedef ")?;
            let start = rest.find("(*")? + 2;
            let end = start + rest[start..].find(')')?;
            Some(rest[start..end].trim().to_string())
        })
        .collect()
}

/// `type name` split at the last identifier (`const char *path` is
/// `("const char *", "path")`).
fn split_decl(decl: &str) -> (String, String) {
    let decl = decl.trim();
    let cut = decl
        .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    (
        decl[..cut].trim().to_string(),
        decl[cut..].trim().to_string(),
    )
}

/// Every function declared in the header's `extern "C"` block.
fn functions(header: &str) -> Vec<Function> {
    let block = header
        .split("extern \"C\" {")
        .nth(1)
        .expect("the header's extern \"C\" block");
    let mut out = Vec::new();
    for d in declarations(block) {
        if d.starts_with('}') || d.starts_with("typedef") {
            continue;
        }
        let Some(open) = d.find('(') else { continue };
        let close = d.rfind(')').expect("a closing parenthesis");
        let (ret, name) = split_decl(&d[..open]);
        let inner = d[open + 1..close].trim();
        assert!(
            !inner.contains('('),
            "{name}: a parameter of function type is not typedef'd: {d}"
        );
        let params = if inner == "void" || inner.is_empty() {
            Vec::new()
        } else {
            inner.split(',').map(split_decl).collect()
        };
        out.push(Function { ret, name, params });
    }
    out
}

/// The argument profiles (see the module documentation).
const PROFILES: [&str; 5] = ["zero", "max", "buffers", "live", "live-max"];

/// The C limits of the integer types the header uses: (maximum, minimum
/// for a signed type).
fn int_limits(ty: &str) -> Option<(&'static str, Option<&'static str>)> {
    Some(match ty {
        "uint8_t" => ("UINT8_MAX", None),
        "uint16_t" => ("UINT16_MAX", None),
        "uint32_t" => ("UINT32_MAX", None),
        "uint64_t" => ("UINT64_MAX", None),
        "uintptr_t" | "size_t" => ("UINTPTR_MAX", None),
        "int8_t" => ("INT8_MAX", Some("-1")),
        "int16_t" => ("INT16_MAX", Some("-1")),
        "int32_t" | "int" => ("INT32_MAX", Some("-1")),
        "int64_t" => ("INT64_MAX", Some("-1")),
        "intptr_t" | "ptrdiff_t" | "ssize_t" => ("INTPTR_MAX", Some("-1")),
        _ => return None,
    })
}

/// The C expression for parameter `i` (`ty name`) of `f` in `profile`.
fn argument(
    f: &Function,
    i: usize,
    ty: &str,
    name: &str,
    profile: &str,
    fn_ptrs: &[String],
) -> String {
    if ty == "ReservoirAllocator *" || ty == "struct ReservoirAllocator *" {
        return match profile {
            "zero" => "(ReservoirAllocator *)0".into(),
            "max" => "destroyed".into(),
            "buffers" => "forged".into(),
            _ => "live".into(),
        };
    }
    if fn_ptrs.iter().any(|t| t == ty) {
        return format!("({ty})0");
    }
    if let Some(base) = ty.strip_suffix('*') {
        let base = base.trim();
        let buffers = profile == "buffers" || profile == "live";
        // What the callee owns or reads as its own object stays null.
        let owned =
            base == "void" || base.contains("ReservoirPoolCheckpoint") || f.name.ends_with("_free");
        if base == "const char" {
            return if buffers {
                "\"\"".into()
            } else {
                "(const char *)0".into()
            };
        }
        if buffers && !owned {
            return format!("({ty})(void *)scratch[{i}]");
        }
        return format!("({ty})0");
    }
    match ty {
        "bool" => (profile != "zero").to_string(),
        "double" | "float" => match profile {
            "zero" => "0.0".into(),
            "max" => "NAN".into(),
            "buffers" => "-1.0".into(),
            "live" => "-INFINITY".into(),
            _ => "INFINITY".into(),
        },
        _ => {
            let (max, minus_one) = int_limits(ty).unwrap_or_else(|| {
                panic!(
                    "{}: parameter {name} has type {ty:?} that the generator does not know: \
                     extend `argument` in tests/c_header_calls.rs",
                    f.name
                )
            });
            match profile {
                "zero" | "buffers" | "live" => format!("({ty})0"),
                "max" => minus_one.map_or(format!("({ty}){max}"), |m| format!("({ty}){m}")),
                _ => format!("({ty}){max}"),
            }
        }
    }
}

/// The C program calling every function of `fs` in every profile.
fn program(fs: &[Function], fn_ptrs: &[String]) -> (String, usize) {
    let mut c = String::new();
    c.push_str(
        r#"/* Generated by crates/reservoir-capi/tests/c_header_calls.rs from
 * include/reservoir.h: every function, every argument profile. */
#include "reservoir.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int calls = 0, failed = 0;
/* Zeroed scratch buffers, one per parameter position. */
_Alignas(16) static unsigned char scratch[16][1 << 16];

static ReservoirAllocator *make(void) {
    ReservoirAllocator *h = (ReservoirAllocator *)0;
    ReservoirStatus s = reservoir_allocator_create(0, 0, 0, (const char *)0, &h);
    if (s != RESERVOIR_OK || !h) {
        fprintf(stderr, "cannot create a simulated allocator: %s\n", reservoir_last_error());
        exit(2);
    }
    return h;
}

static void clear(void) { memset(scratch, 0, sizeof scratch); }

static void check_message(const char *what) {
    const char *m = reservoir_last_error();
    if (!m || strstr(m, "panicked")) {
        failed++;
        fprintf(stderr, "FAIL %s: a panic crossed into the error: %s\n", what, m ? m : "(null)");
    }
}

static void check_status(const char *what, ReservoirStatus s) {
    int v = (int)s;
    if (v < 0 || v > 13 || s == RESERVOIR_ERR_PANIC || s == RESERVOIR_ERR_POISONED) {
        failed++;
        fprintf(stderr, "FAIL %s -> %d (%s): %s\n", what, v, reservoir_status_name(v),
                reservoir_last_error());
    }
    check_message(what);
}

int main(void) {
    ReservoirAllocator *destroyed = make();
    ReservoirAllocator *live = (ReservoirAllocator *)0;
    ReservoirAllocator *forged = (ReservoirAllocator *)(uintptr_t)(((uint64_t)0x7fffff << 16) | 0x5e5e);
    if (reservoir_allocator_destroy(destroyed) != RESERVOIR_OK) {
        fprintf(stderr, "destroy failed: %s\n", reservoir_last_error());
        return 2;
    }
    (void)live;
    (void)forged;
"#,
    );
    let mut n = 0;
    for profile in PROFILES {
        let _ = writeln!(c, "    /* profile {profile} */");
        for f in fs {
            let args: Vec<String> = f
                .params
                .iter()
                .enumerate()
                .map(|(i, (ty, name))| argument(f, i, ty, name, profile, fn_ptrs))
                .collect();
            let takes_handle = f
                .params
                .iter()
                .any(|(t, _)| t.contains("ReservoirAllocator *"));
            let what = format!("{profile}: {}({})", f.name, args.join(", "))
                .replace('\\', "\\\\")
                .replace('"', "\\\"");
            let _ = writeln!(c, "    clear();");
            if profile.starts_with("live") && takes_handle {
                let _ = writeln!(c, "    live = make();");
            }
            let call = format!("{}({})", f.name, args.join(", "));
            let _ = writeln!(c, "    calls++;");
            match f.ret.as_str() {
                "enum ReservoirStatus" | "ReservoirStatus" => {
                    let _ = writeln!(c, "    check_status(\"{what}\", {call});");
                }
                "void" => {
                    let _ = writeln!(c, "    {call};");
                    let _ = writeln!(c, "    check_message(\"{what}\");");
                }
                _ => {
                    let _ = writeln!(c, "    (void)({call});");
                    let _ = writeln!(c, "    check_message(\"{what}\");");
                }
            }
            if profile.starts_with("live") && takes_handle {
                // Gone already when the call was the destroy.
                let _ = writeln!(c, "    (void)reservoir_allocator_destroy(live);");
            }
            n += 1;
        }
    }
    let _ = writeln!(
        c,
        "    printf(\"capi-header-calls: %d calls, %d failed\\n\", calls, failed);\n    return failed ? 1 : 0;\n}}"
    );
    (c, n)
}

/// The directory holding this test binary and the crate's library builds.
fn deps_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent().expect("deps directory").to_path_buf()
}

/// Compile `source` with `compiler` and `flags`, link `lib` (+ `libs`), run
/// it; returns its standard output.
fn build_and_run(
    name: &str,
    compiler: &str,
    flags: &[&str],
    source: &Path,
    lib: &[String],
) -> String {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let deps = deps_dir();
    let exe = source.with_file_name(name);
    let out = Command::new(compiler)
        .args(flags)
        .args(["-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(manifest.join("include"))
        .arg(source)
        .args(lib)
        .arg(format!("-Wl,-rpath,{}", deps.display()))
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} failed on {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{name}: {stdout}");
    eprintln!("{stderr}");
    assert!(
        run.status.code().is_some(),
        "{name} was killed by a signal: {} (a crash)\n{stderr}",
        run.status
    );
    assert!(
        run.status.success(),
        "{name} exited with {}\n{stdout}\n{stderr}",
        run.status
    );
    stdout
}

#[test]
fn every_header_function_answers_edge_arguments_from_c_and_cpp() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(manifest.join("include/reservoir.h")).expect("the header");
    let fs = functions(&header);
    let fn_ptrs = fn_pointer_typedefs(&header);
    assert!(fs.len() >= 40, "only {} functions parsed", fs.len());
    let mut names = BTreeMap::new();
    for f in &fs {
        assert!(
            names.insert(f.name.clone(), ()).is_none(),
            "{} twice",
            f.name
        );
    }
    for must in [
        "reservoir_allocator_create",
        "reservoir_torch_begin_allocate_to_pool",
        "reservoir_torch_record_history",
        "reservoir_torch_attach_trace_tracker",
    ] {
        assert!(names.contains_key(must), "{must} not parsed");
    }
    let (source, n) = program(&fs, &fn_ptrs);
    let scratch = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("capi-header-calls");
    std::fs::create_dir_all(&scratch).unwrap();
    // One source; C++ gets a copy with the C++ suffix and spells `_Alignas`
    // its own way.
    let c_file = scratch.join("calls.c");
    std::fs::write(&c_file, &source).unwrap();
    let cpp_file = scratch.join("calls.cpp");
    std::fs::write(&cpp_file, source.replace("_Alignas(16)", "alignas(16)")).unwrap();

    let deps = deps_dir();
    let so = deps.join("libreservoir_capi.so");
    let a = deps.join("libreservoir_capi.a");
    assert!(so.exists(), "{} missing", so.display());
    let sys = ["-lpthread", "-ldl", "-lm", "-lrt", "-lutil", "-lgcc_s"].map(String::from);
    let mut c_libs = vec![so.display().to_string()];
    c_libs.extend(sys.iter().cloned());
    let cc = std::env::var("CC").unwrap_or_else(|_| "gcc".into());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "g++".into());
    let mut outputs = vec![build_and_run(
        "calls_c",
        &cc,
        &["-std=c11", "-D_DEFAULT_SOURCE"],
        &c_file,
        &c_libs,
    )];
    // C++ against the staticlib when cargo built one, else the cdylib.
    let mut cpp_libs = vec![if a.exists() {
        a.display().to_string()
    } else {
        so.display().to_string()
    }];
    cpp_libs.extend(sys.iter().cloned());
    outputs.push(build_and_run(
        "calls_cpp",
        &cxx,
        &["-std=c++17"],
        &cpp_file,
        &cpp_libs,
    ));
    for out in &outputs {
        let want = format!("capi-header-calls: {n} calls, 0 failed");
        assert!(out.contains(&want), "want `{want}`, got:\n{out}");
    }
    // Written past libtest's capture, so CI's log shows both lines.
    let mut err = std::io::stderr().lock();
    if let Err(e) = reservoir_cuda::CudaDevice::new(0) {
        let _ = writeln!(
            err,
            "\nSKIPPED-BACKEND cuda (reservoir-capi c_header_calls): the reservoir_torch_* calls \
             only reached the unavailable driver: {e}"
        );
    }
    let _ = writeln!(
        err,
        "\ncapi header calls: {} functions x {} profiles = {n} calls from C and C++, 0 failed",
        fs.len(),
        PROFILES.len()
    );
}
