//! Trace specifications: what to generate and how to run it through the
//! oracle; the list of golden traces; a small command line.

use std::fmt::Write as _;

use super::gen::{generate, GenKind};
use super::Trace;
use reservoir::checksum::Fnv1a;
use reservoir::rng::SplitMix64;

/// The fake device's default capacity (`FAKECUDA_TOTAL_MEM` default, an
/// H100 80 GB): 85,045,870,592 bytes.
pub const FAKE_DEFAULT_CAPACITY: u64 = 85_045_870_592;

/// Everything that determines one generated trace and its oracle run.
#[derive(Clone, Debug, PartialEq)]
pub struct GenSpec {
    /// Unique name (also the golden file's stem), e.g. `oom-007`.
    pub name: String,
    /// Workload shape.
    pub kind: GenKind,
    /// Generator seed.
    pub seed: u64,
    /// Target number of ops (the trace may be a few ops longer).
    pub ops: usize,
    /// `PYTORCH_CUDA_ALLOC_CONF` for the run ("" = defaults).
    pub conf: String,
    /// Device capacity in bytes (`--capacity`).
    pub capacity: u64,
    /// `torch.cuda.set_per_process_memory_fraction(f)` called once before
    /// the first op (`--fraction` of `tools/oracle_replay_ext.py`), if any.
    pub fraction: Option<f64>,
}

impl GenSpec {
    /// The memory the allocator may use: the capacity, times the memory
    /// fraction when one below 1 is set (by [`GenSpec::fraction`] or the
    /// `per_process_memory_fraction` setting). The generator scales to it.
    pub fn limit(&self) -> u64 {
        let mut f = self.fraction.unwrap_or(1.0);
        for item in self.conf.split(',') {
            if let Some(v) = item.trim().strip_prefix("per_process_memory_fraction:") {
                if let Ok(x) = v.trim().parse::<f64>() {
                    f = f.min(x);
                }
            }
        }
        if f < 1.0 {
            (self.capacity as f64 * f) as u64
        } else {
            self.capacity
        }
    }

    /// Generate the trace (with a header comment naming the spec).
    pub fn trace(&self) -> Trace {
        let ops = generate(self.kind, self.seed, self.ops, self.limit());
        let header = vec![
            format!("reservoir golden trace {}", self.name),
            format!(
                "kind {} seed {} ops {} capacity {} conf {:?} fraction {}",
                self.kind,
                self.seed,
                self.ops,
                self.capacity,
                self.conf,
                self.fraction.map_or("none".to_string(), |f| f.to_string())
            ),
        ];
        Trace::from_ops(ops, header)
    }

    /// Extra command-line arguments for `tools/oracle_replay_ext.py`.
    pub fn oracle_args(&self) -> Vec<String> {
        let mut v = vec!["--capacity".to_string(), self.capacity.to_string()];
        if !self.conf.is_empty() {
            v.push("--conf".to_string());
            v.push(self.conf.clone());
        }
        if let Some(f) = self.fraction {
            v.push("--fraction".to_string());
            v.push(f.to_string());
        }
        v
    }

    /// The spec as a one-line JSON object (keys `name`, `kind`, `seed`,
    /// `ops`, `conf`, `capacity`, `fraction`), plus `fingerprint` (the
    /// trace's [`Trace::fingerprint`] as a hex string) if given.
    pub fn to_json(&self, fingerprint: Option<u64>) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\"name\": {}, \"kind\": {}, \"seed\": {}, \"ops\": {}, \"conf\": {}, \"capacity\": {}, \"fraction\": {}",
            json_str(&self.name),
            json_str(self.kind.as_str()),
            self.seed,
            self.ops,
            json_str(&self.conf),
            self.capacity,
            self.fraction.map_or("null".to_string(), |f| format!("{f:?}")),
        );
        if let Some(fp) = fingerprint {
            let _ = write!(s, ", \"fingerprint\": \"{fp:016x}\"");
        }
        s.push('}');
        s
    }
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The seed of the `index`-th golden trace of a kind: independent of the
/// other kinds and of how many traces each kind has.
pub fn golden_seed(kind: GenKind, index: u64) -> u64 {
    let mut h = Fnv1a::new();
    h.write(kind.as_str().as_bytes());
    SplitMix64::new(h.finish() ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64()
}

const MAX_SPLIT_MB: [u64; 9] = [20, 32, 64, 100, 128, 200, 256, 512, 1024];
const ROUND_LISTS: [&str; 7] = [
    "[256:1,512:2,1024:4,>:8]",
    "[1:4,64:8,>:2]",
    "[>:16]",
    "[2:2,4:4,8:8,16:16,>:1]",
    "[64:8,>:2]",
    "[1:1,2:2,4:4,8:8,16:16,32:16,64:8,128:4,256:2,>:1]",
    "[1024:16,>:4]",
];
const GC_THRESHOLDS: [&str; 5] = ["0.3", "0.5", "0.6", "0.8", "0.95"];
const FRACTIONS: [f64; 6] = [0.5, 0.6, 0.75, 0.8, 0.9, 0.99];

fn max_split_conf(r: &mut SplitMix64) -> String {
    let mut s = format!("max_split_size_mb:{}", r.pick(&MAX_SPLIT_MB));
    if r.chance(0.3) {
        let _ = write!(
            s,
            ",max_non_split_rounding_mb:{}",
            r.pick(&[32u64, 64, 256, 1024])
        );
    }
    s
}

fn rounding_conf(r: &mut SplitMix64) -> String {
    if r.chance(0.5) {
        format!("roundup_power2_divisions:{}", r.pick(&[1u64, 2, 4, 8, 16]))
    } else {
        format!("roundup_power2_divisions:{}", r.pick(&ROUND_LISTS))
    }
}

/// Settings variants used in the golden list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Default,
    MaxSplit,
    Rounding,
    Expandable,
    LargeSegment,
    Combo,
    ReleaseLock,
    /// A memory fraction set by call (`--fraction`).
    Fraction,
    /// GC threshold with a fraction set by call.
    Gc,
    /// GC threshold with `per_process_memory_fraction` in the settings.
    GcConfFraction,
    /// GC threshold and max_split.
    GcMaxSplit,
    /// GC threshold with fraction 1.0 (no limit: GC inactive).
    GcFractionOne,
    /// GC threshold without a fraction (inactive).
    GcNoFraction,
    /// GC threshold, fraction, expandable segments.
    GcExpandable,
}

fn variant_conf(v: Variant, r: &mut SplitMix64) -> (String, Option<f64>) {
    let gc =
        |r: &mut SplitMix64| format!("garbage_collection_threshold:{}", r.pick(&GC_THRESHOLDS));
    match v {
        Variant::Default => (String::new(), None),
        Variant::MaxSplit => (max_split_conf(r), None),
        Variant::Rounding => (rounding_conf(r), None),
        Variant::Expandable => {
            let extra = match r.below(4) {
                0 => format!(",{}", max_split_conf(r)),
                1 => format!(",{}", rounding_conf(r)),
                _ => String::new(),
            };
            (format!("expandable_segments:True{extra}"), None)
        }
        Variant::LargeSegment => (
            format!("large_segment_size_mb:{}", r.pick(&[32u64, 40, 64])),
            None,
        ),
        Variant::Combo => (
            format!("{},{},{}", max_split_conf(r), rounding_conf(r), gc(r)),
            Some(*r.pick(&FRACTIONS)),
        ),
        Variant::ReleaseLock => ("release_lock_on_cudamalloc:True".to_string(), None),
        Variant::Fraction => (String::new(), Some(*r.pick(&FRACTIONS))),
        Variant::Gc => (gc(r), Some(*r.pick(&FRACTIONS))),
        Variant::GcConfFraction => {
            let f = r.pick(&FRACTIONS);
            (format!("{},per_process_memory_fraction:{f}", gc(r)), None)
        }
        Variant::GcMaxSplit => (
            format!("{},{}", gc(r), max_split_conf(r)),
            Some(*r.pick(&FRACTIONS)),
        ),
        Variant::GcFractionOne => (gc(r), Some(1.0)),
        Variant::GcNoFraction => (gc(r), None),
        Variant::GcExpandable => (
            format!("expandable_segments:True,{}", gc(r)),
            Some(*r.pick(&FRACTIONS)),
        ),
    }
}

/// Capacity choices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cap {
    /// The fake's default (80 GB).
    Default,
    /// Half default, half a small device.
    Mixed,
    /// A small device, chosen from the list.
    Small(&'static [u64]),
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const SMALL_CAPS: [u64; 6] = [256 * MIB, 512 * MIB, GIB, 2 * GIB, 4 * GIB, 8 * GIB];
const OOM_CAPS: [u64; 10] = [
    32 * MIB,
    48 * MIB,
    64 * MIB,
    100 * MIB,
    128 * MIB,
    256 * MIB,
    500 * MIB,
    GIB,
    2 * GIB,
    4 * GIB,
];
const STREAM_CAPS: [u64; 5] = [128 * MIB, 256 * MIB, 512 * MIB, GIB, 2 * GIB];
const GC_CAPS: [u64; 6] = [256 * MIB, 512 * MIB, GIB, 2 * GIB, 4 * GIB, 8 * GIB];
const SPLIT_CAPS: [u64; 6] = [
    512 * MIB,
    GIB,
    2 * GIB,
    4 * GIB,
    8 * GIB,
    FAKE_DEFAULT_CAPACITY,
];

struct Plan {
    kind: GenKind,
    count: u64,
    variants: &'static [Variant],
    cap: Cap,
    ops: (u64, u64),
}

const PLANS: [Plan; 13] = {
    use Variant::*;
    [
        Plan {
            kind: GenKind::Uniform,
            count: 30,
            variants: &[
                Default,
                Default,
                Default,
                MaxSplit,
                Rounding,
                Expandable,
                LargeSegment,
                Combo,
                Gc,
                ReleaseLock,
            ],
            cap: Cap::Default,
            ops: (300, 3000),
        },
        Plan {
            kind: GenKind::Layers,
            count: 24,
            variants: &[
                Default, Default, Rounding, MaxSplit, Expandable, Combo, Default, Fraction,
            ],
            cap: Cap::Mixed,
            ops: (500, 4000),
        },
        Plan {
            kind: GenKind::Growing,
            count: 16,
            variants: &[Default, Default, Expandable, MaxSplit],
            cap: Cap::Mixed,
            ops: (300, 3000),
        },
        Plan {
            kind: GenKind::Bursts,
            count: 20,
            variants: &[Default, Default, MaxSplit, Expandable, Rounding],
            cap: Cap::Mixed,
            ops: (300, 3000),
        },
        Plan {
            kind: GenKind::Small,
            count: 14,
            variants: &[
                Default,
                Default,
                Rounding,
                Expandable,
                MaxSplit,
                Default,
                LargeSegment,
            ],
            cap: Cap::Default,
            ops: (300, 3000),
        },
        Plan {
            kind: GenKind::Boundaries,
            count: 16,
            variants: &[
                Default,
                MaxSplit,
                Rounding,
                Default,
                Expandable,
                LargeSegment,
                Combo,
                Default,
            ],
            cap: Cap::Default,
            ops: (300, 2500),
        },
        Plan {
            kind: GenKind::Huge,
            count: 12,
            variants: &[Default, Default, Rounding, MaxSplit, Expandable, Default],
            cap: Cap::Default,
            ops: (150, 600),
        },
        Plan {
            kind: GenKind::Oom,
            count: 32,
            variants: &[
                Default, Default, Default, MaxSplit, Expandable, Fraction, Rounding, Default,
            ],
            cap: Cap::Small(&OOM_CAPS),
            ops: (300, 2500),
        },
        Plan {
            kind: GenKind::Streams,
            count: 30,
            variants: &[Default, Default, Default, Default, Expandable, MaxSplit],
            cap: Cap::Small(&STREAM_CAPS),
            ops: (300, 3000),
        },
        Plan {
            kind: GenKind::StreamsSync,
            count: 16,
            variants: &[Default, Default, Expandable, Default],
            cap: Cap::Mixed,
            ops: (300, 2500),
        },
        Plan {
            kind: GenKind::Gc,
            count: 24,
            variants: &[
                Gc,
                GcConfFraction,
                GcMaxSplit,
                Gc,
                GcFractionOne,
                GcNoFraction,
                GcExpandable,
                Gc,
            ],
            cap: Cap::Small(&GC_CAPS),
            ops: (300, 3000),
        },
        Plan {
            kind: GenKind::MaxSplit,
            count: 16,
            variants: &[MaxSplit],
            cap: Cap::Small(&SPLIT_CAPS),
            ops: (300, 2500),
        },
        Plan {
            kind: GenKind::Rounding,
            count: 16,
            variants: &[Rounding],
            cap: Cap::Default,
            ops: (300, 2500),
        },
    ]
};

/// The golden traces: every spec the committed golden files were made from,
/// in a fixed order. Each kind's entries are numbered from 0 and seeded by
/// [`golden_seed`], so adding entries to one kind leaves the others alone.
pub fn golden_specs() -> Vec<GenSpec> {
    let mut out = Vec::new();
    for plan in &PLANS {
        for i in 0..plan.count {
            let seed = golden_seed(plan.kind, i);
            // A separate stream of choices for the settings, derived from the seed.
            let mut r = SplitMix64::new(seed ^ 0x5eed_5eed_5eed_5eed);
            let variant = plan.variants[(i % plan.variants.len() as u64) as usize];
            let (conf, fraction) = variant_conf(variant, &mut r);
            let capacity = match plan.cap {
                Cap::Default => FAKE_DEFAULT_CAPACITY,
                Cap::Mixed if i % 2 == 0 => FAKE_DEFAULT_CAPACITY,
                Cap::Mixed => *r.pick(&SMALL_CAPS),
                Cap::Small(list) => {
                    if plan.kind == GenKind::Streams && i % 3 == 0 {
                        FAKE_DEFAULT_CAPACITY
                    } else {
                        *r.pick(list)
                    }
                }
            };
            // Fractions and GC want a device of a size where the limit matters.
            let capacity = if fraction.is_some() && capacity == FAKE_DEFAULT_CAPACITY {
                *r.pick(&SMALL_CAPS)
            } else {
                capacity
            };
            let ops = r.range(plan.ops.0, plan.ops.1) as usize;
            out.push(GenSpec {
                name: format!("{}-{:03}", plan.kind, i),
                kind: plan.kind,
                seed,
                ops,
                conf,
                capacity,
                fraction,
            });
        }
    }
    out
}

/// The manifest of a set of specs: a JSON object with `format` and `specs`,
/// one spec per line (with each trace's fingerprint).
pub fn manifest_json(specs: &[GenSpec]) -> String {
    let mut s = String::from("{\"format\": \"reservoir-golden-manifest/1\",\n \"specs\": [\n");
    for (i, spec) in specs.iter().enumerate() {
        let fp = spec.trace().fingerprint();
        s.push_str("  ");
        s.push_str(&spec.to_json(Some(fp)));
        s.push_str(if i + 1 < specs.len() { ",\n" } else { "\n" });
    }
    s.push_str(" ]\n}\n");
    s
}

const USAGE: &str = "usage:
  gen_traces write DIR            write DIR/<name>.txt for every golden spec, DIR/manifest.json,
                                  and DIR/args.tsv (name, then oracle_replay_ext.py arguments)
  gen_traces list                 print the golden manifest (JSON)
  gen_traces trace NAME           print the trace of one golden spec
  gen_traces gen KIND SEED [OPS [LIMIT]]   print a trace of any kind (LIMIT in bytes, default 8G)
kinds: ";

/// Write `bytes` to `path` through a temporary file renamed into place
/// (`reservoir::outfile`): a failed write keeps the previous file.
fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), String> {
    reservoir::outfile::write_file(path, |w| w.write_all(bytes))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The command line of the `gen_trace` example (used by `tools/regen-goldens.sh`)
/// (`args` without the program name). Output goes to stdout or files;
/// errors come back as text.
pub fn cli(args: &[String]) -> Result<(), String> {
    let usage = || {
        let kinds: Vec<&str> = GenKind::ALL.iter().map(|k| k.as_str()).collect();
        format!("{USAGE}{}", kinds.join(" "))
    };
    let num = |s: &str| -> Result<u64, String> {
        super::parse_size(s).ok_or_else(|| format!("not a number: {s:?}"))
    };
    match args.first().map(String::as_str) {
        Some("write") if args.len() == 2 => {
            let dir = std::path::Path::new(&args[1]);
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let specs = golden_specs();
            let mut tsv = String::new();
            for spec in &specs {
                let path = dir.join(format!("{}.txt", spec.name));
                write_file(&path, spec.trace().to_text().as_bytes())?;
                tsv.push_str(&spec.name);
                for a in spec.oracle_args() {
                    tsv.push('\t');
                    tsv.push_str(&a);
                }
                tsv.push('\n');
            }
            let m = dir.join("manifest.json");
            write_file(&m, manifest_json(&specs).as_bytes())?;
            let a = dir.join("args.tsv");
            write_file(&a, tsv.as_bytes())?;
            println!("{} traces written to {}", specs.len(), dir.display());
            Ok(())
        }
        Some("list") if args.len() == 1 => {
            print!("{}", manifest_json(&golden_specs()));
            Ok(())
        }
        Some("trace") if args.len() == 2 => {
            let spec = golden_specs()
                .into_iter()
                .find(|s| s.name == args[1])
                .ok_or_else(|| format!("no golden spec named {:?}", args[1]))?;
            print!("{}", spec.trace().to_text());
            Ok(())
        }
        Some("gen") if (3..=5).contains(&args.len()) => {
            let kind = GenKind::parse(&args[1])
                .ok_or_else(|| format!("unknown kind {:?}\n{}", args[1], usage()))?;
            let seed = num(&args[2])?;
            let ops = args.get(3).map(|s| num(s)).transpose()?.unwrap_or(1000) as usize;
            let limit = args.get(4).map(|s| num(s)).transpose()?.unwrap_or(8 << 30);
            let t = Trace::from_ops(
                generate(kind, seed, ops, limit),
                vec![format!("kind {kind} seed {seed} ops {ops} limit {limit}")],
            );
            print!("{}", t.to_text());
            Ok(())
        }
        _ => Err(usage()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_list_is_unique_and_large_enough() {
        let specs = golden_specs();
        assert!(specs.len() >= 200);
        let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), specs.len());
    }

    #[test]
    fn limit_uses_fraction_and_setting() {
        let mut s = golden_specs()[0].clone();
        s.capacity = 1000;
        s.conf = String::new();
        s.fraction = None;
        assert_eq!(s.limit(), 1000);
        s.fraction = Some(0.5);
        assert_eq!(s.limit(), 500);
        s.fraction = None;
        s.conf = "garbage_collection_threshold:0.5,per_process_memory_fraction:0.25".into();
        assert_eq!(s.limit(), 250);
    }

    #[test]
    fn json_is_one_line() {
        let s = &golden_specs()[0];
        let j = s.to_json(Some(1));
        assert!(j.starts_with("{\"name\": \"uniform-000\""));
        assert!(j.ends_with("\"fingerprint\": \"0000000000000001\"}"));
        assert!(!j.contains('\n'));
    }
}
