//! Matching the allocations of two recordings of one program: a longest
//! common subsequence of their call-site keys (Myers' O((N+M)D) diff),
//! with the k-th allocation of a key matched to the k-th as the fallback
//! when the recordings differ in more than [`MAX_EDITS`] places.

use rustc_hash::FxHashMap;

/// Most insertions and deletions the diff looks for before it falls back
/// to matching by occurrence (its memory grows with their square: about
/// 32 MB at this bound).
pub const MAX_EDITS: usize = 2000;

/// The pairs `(i, j)` with `a[i] == b[j]` of a longest common subsequence
/// of `a` and `b`, in order; past [`MAX_EDITS`] edits, the k-th occurrence
/// of each key in `a` paired with its k-th occurrence in `b`.
pub fn match_keys(a: &[u64], b: &[u64]) -> Vec<(usize, usize)> {
    // A common prefix and suffix are matched as they are.
    let pre = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let suf = a[pre..]
        .iter()
        .rev()
        .zip(b[pre..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (ma, mb) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    let middle = myers(ma, mb, MAX_EDITS).unwrap_or_else(|| by_occurrence(ma, mb));
    let mut out: Vec<(usize, usize)> = (0..pre).map(|i| (i, i)).collect();
    out.extend(middle.into_iter().map(|(i, j)| (i + pre, j + pre)));
    out.extend((0..suf).map(|k| (a.len() - suf + k, b.len() - suf + k)));
    out
}

/// The k-th occurrence of each key in `a` paired with its k-th in `b`.
fn by_occurrence(a: &[u64], b: &[u64]) -> Vec<(usize, usize)> {
    let mut positions: FxHashMap<u64, Vec<usize>> = FxHashMap::default();
    for (j, k) in b.iter().enumerate() {
        positions.entry(*k).or_default().push(j);
    }
    let mut seen: FxHashMap<u64, usize> = FxHashMap::default();
    let mut out = Vec::new();
    for (i, k) in a.iter().enumerate() {
        let n = seen.entry(*k).or_default();
        if let Some(&j) = positions.get(k).and_then(|p| p.get(*n)) {
            out.push((i, j));
        }
        *n += 1;
    }
    out
}

/// Myers' greedy diff: the matched pairs of a shortest edit script, or
/// `None` when it needs more than `max_d` insertions and deletions.
fn myers(a: &[u64], b: &[u64], max_d: usize) -> Option<Vec<(usize, usize)>> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let off = max_d as isize + 1;
    let mut v = vec![0isize; 2 * max_d + 3];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let at = |k: isize| (k + off) as usize;
    for d in 0..=max_d as isize {
        trace.push(v.clone());
        let mut k = -d;
        while k <= d {
            let mut x = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
                v[at(k + 1)]
            } else {
                v[at(k - 1)] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[at(k)] = x;
            if x >= n && y >= m {
                return Some(backtrack(&trace, n, m, off));
            }
            k += 2;
        }
    }
    None
}

/// The matched pairs of the edit script the saved frontiers describe.
fn backtrack(trace: &[Vec<isize>], n: isize, m: isize, off: isize) -> Vec<(usize, usize)> {
    let at = |k: isize| (k + off) as usize;
    let (mut x, mut y) = (n, m);
    let mut out = Vec::new();
    for (d, v) in trace.iter().enumerate().rev() {
        let d = d as isize;
        let k = x - y;
        let (px, py) = if d == 0 {
            (0, 0)
        } else {
            let pk = if k == -d || (k != d && v[at(k - 1)] < v[at(k + 1)]) {
                k + 1
            } else {
                k - 1
            };
            (v[at(pk)], v[at(pk)] - pk)
        };
        while x > px && y > py {
            out.push(((x - 1) as usize, (y - 1) as usize));
            x -= 1;
            y -= 1;
        }
        x = px;
        y = py;
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcs_len(a: &[u64], b: &[u64]) -> usize {
        let mut t = vec![vec![0usize; b.len() + 1]; a.len() + 1];
        for i in 0..a.len() {
            for j in 0..b.len() {
                t[i + 1][j + 1] = if a[i] == b[j] {
                    t[i][j] + 1
                } else {
                    t[i][j + 1].max(t[i + 1][j])
                };
            }
        }
        t[a.len()][b.len()]
    }

    #[test]
    fn a_longest_common_subsequence_in_order() {
        let cases: [(&[u64], &[u64]); 5] = [
            (&[1, 2, 3, 4, 5], &[1, 2, 9, 4, 5]),
            (&[1, 2, 3], &[]),
            (&[7, 1, 7, 2, 7, 3], &[1, 7, 7, 2, 3, 3]),
            (&[1, 1, 1, 1], &[1, 1]),
            (&[5, 6, 7, 8], &[9, 5, 6, 7, 8, 1]),
        ];
        for (a, b) in cases {
            let m = match_keys(a, b);
            assert_eq!(m.len(), lcs_len(a, b), "{a:?} {b:?}");
            assert!(m.iter().all(|&(i, j)| a[i] == b[j]));
            assert!(m.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        }
    }

    #[test]
    fn past_the_edit_bound_by_occurrence() {
        let a: Vec<u64> = (0..10).collect();
        let b: Vec<u64> = (0..10).rev().collect();
        assert!(myers(&a, &b, 2).is_none());
        let m = by_occurrence(&a, &b);
        assert_eq!(m.len(), 10);
        assert!(m.iter().all(|&(i, j)| a[i] == b[j]));
    }
}
