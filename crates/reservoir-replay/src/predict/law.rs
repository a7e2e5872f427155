//! The scaling law of one allocation: its requested bytes as a function of
//! the program's size `x` (a batch, a context length), fitted to the
//! sizes it had in recordings at several `x`.
//!
//! The candidates are sums of the terms `a` (constant), `b·x` (linear) and
//! `c·x²` (quadratic: attention scores grow with the square of the
//! context). The law is the one with the fewest terms that reproduces
//! every recorded size to within half the allocation's granule or 0.2 %;
//! among laws with as many terms, the closest; when none does, the closest
//! with as many terms as there are recordings (at most 3).

/// Which terms a law has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LawKind {
    /// `a`: the same size at every `x` (weights, optimizer state).
    Constant,
    /// `b·x`.
    Linear,
    /// `c·x²`.
    Quadratic,
    /// `a + b·x`.
    Affine,
    /// `a + c·x²`.
    ConstantQuadratic,
    /// `b·x + c·x²`.
    LinearQuadratic,
    /// `a + b·x + c·x²`.
    Polynomial,
}

impl LawKind {
    /// Every kind, fewest terms first.
    pub const ALL: [LawKind; 7] = [
        LawKind::Constant,
        LawKind::Linear,
        LawKind::Quadratic,
        LawKind::Affine,
        LawKind::ConstantQuadratic,
        LawKind::LinearQuadratic,
        LawKind::Polynomial,
    ];

    /// The law as a formula.
    pub fn formula(self) -> &'static str {
        match self {
            LawKind::Constant => "a",
            LawKind::Linear => "b·x",
            LawKind::Quadratic => "c·x²",
            LawKind::Affine => "a + b·x",
            LawKind::ConstantQuadratic => "a + c·x²",
            LawKind::LinearQuadratic => "b·x + c·x²",
            LawKind::Polynomial => "a + b·x + c·x²",
        }
    }

    /// The powers of `x` it sums.
    fn powers(self) -> &'static [i32] {
        match self {
            LawKind::Constant => &[0],
            LawKind::Linear => &[1],
            LawKind::Quadratic => &[2],
            LawKind::Affine => &[0, 1],
            LawKind::ConstantQuadratic => &[0, 2],
            LawKind::LinearQuadratic => &[1, 2],
            LawKind::Polynomial => &[0, 1, 2],
        }
    }
}

/// A fitted law: its kind and coefficients, `x` measured in units of
/// `unit` (the largest recorded `x`, for a well-conditioned fit).
#[derive(Clone, Debug, PartialEq)]
pub struct Law {
    /// Which terms.
    pub kind: LawKind,
    coef: [f64; 3],
    unit: f64,
}

impl Law {
    /// Bytes at size `x` (not rounded, may be negative).
    pub fn eval(&self, x: f64) -> f64 {
        let t = x / self.unit;
        self.coef[0] + self.coef[1] * t + self.coef[2] * t * t
    }

    /// Fit a law to the points `(x, bytes)` (distinct `x`, at least one);
    /// `granule` is the allocation's granule in bytes.
    pub fn fit(points: &[(f64, f64)], granule: f64) -> Law {
        let unit = points.iter().map(|p| p.0).fold(1.0, f64::max);
        let fits = |law: &Law| {
            points
                .iter()
                .all(|&(x, s)| (law.eval(x) - s).abs() <= (granule / 2.0).max(s.abs() * 0.002))
        };
        let err = |law: &Law| {
            points
                .iter()
                .map(|&(x, s)| (law.eval(x) - s).abs())
                .fold(0.0, f64::max)
        };
        let most = points.len().min(3);
        let mut fallback: Option<(f64, Law)> = None;
        for terms in 1..=most {
            let mut best: Option<(f64, Law)> = None;
            for kind in LawKind::ALL.iter().filter(|k| k.powers().len() == terms) {
                let Some(law) = solve(*kind, points, unit) else {
                    continue;
                };
                let e = err(&law);
                if fits(&law) && best.as_ref().map_or(true, |b| e < b.0) {
                    best = Some((e, law.clone()));
                }
                if terms == most && fallback.as_ref().map_or(true, |b| e < b.0) {
                    fallback = Some((e, law));
                }
            }
            if let Some((_, law)) = best {
                return law;
            }
        }
        fallback.map(|f| f.1).unwrap_or(Law {
            kind: LawKind::Constant,
            coef: [points.first().map_or(0.0, |p| p.1), 0.0, 0.0],
            unit,
        })
    }
}

/// The least-squares coefficients of `kind` (exact when there are as
/// many points as terms), or `None` for a singular system.
fn solve(kind: LawKind, points: &[(f64, f64)], unit: f64) -> Option<Law> {
    let p = kind.powers();
    let n = p.len();
    // Normal equations: (ΦᵀΦ) c = Φᵀs.
    let mut m = [[0.0f64; 4]; 3];
    for &(x, s) in points {
        let t = x / unit;
        let phi: Vec<f64> = p.iter().map(|&e| t.powi(e)).collect();
        for i in 0..n {
            for j in 0..n {
                m[i][j] += phi[i] * phi[j];
            }
            m[i][n] += phi[i] * s;
        }
    }
    for col in 0..n {
        let pivot = (col..n).max_by(|&a, &b| m[a][col].abs().total_cmp(&m[b][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        let pivot_row = m[col];
        for (row, r) in m.iter_mut().enumerate().take(n) {
            if row != col {
                let f = r[col] / pivot_row[col];
                for (x, p) in r.iter_mut().zip(pivot_row).skip(col).take(n + 1 - col) {
                    *x -= f * p;
                }
            }
        }
    }
    let mut coef = [0.0; 3];
    for (i, &e) in p.iter().enumerate() {
        coef[e as usize] = m[i][n] / m[i][i];
    }
    Some(Law { kind, coef, unit })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_simplest_law_that_reproduces_the_recordings() {
        let pts = |f: &dyn Fn(f64) -> f64, xs: &[f64]| -> Vec<(f64, f64)> {
            xs.iter().map(|&x| (x, f(x))).collect()
        };
        let two = [128.0, 256.0];
        let three = [128.0, 256.0, 512.0];
        let cases: [(&dyn Fn(f64) -> f64, LawKind); 4] = [
            (&|_| 4096.0, LawKind::Constant),
            (&|x| 8.0 * 768.0 * x * 4.0, LawKind::Linear),
            (&|x| 8.0 * 12.0 * x * x * 4.0, LawKind::Quadratic),
            (&|x| 1048576.0 + 1024.0 * x, LawKind::Affine),
        ];
        for (f, kind) in cases {
            let law = Law::fit(&pts(f, &two), 512.0);
            assert_eq!(law.kind, kind);
            assert!((law.eval(1024.0) - f(1024.0)).abs() < 1.0);
        }
        // Three recordings tell a + c·x² from a + b·x.
        let f = |x: f64| 1e6 + 48.0 * x * x;
        let law = Law::fit(&pts(&f, &three), 512.0);
        assert_eq!(law.kind, LawKind::ConstantQuadratic);
        assert!((law.eval(2048.0) - f(2048.0)).abs() < 1.0);
        // One recording: a constant.
        assert_eq!(Law::fit(&[(8.0, 100.0)], 4.0).kind, LawKind::Constant);
    }
}
