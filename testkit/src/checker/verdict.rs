//! The verdict: every critical section checked against every other.

use super::log::Section;

/// What the merged logs show.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub sections: usize,
    /// Pairs of sections on one resource that overlap: (earlier, later).
    pub overlaps: Vec<(Section, Section)>,
    /// Sections that left at or after their lease deadline, or whose lease was not valid.
    pub late: Vec<Section>,
    /// Sections that carried a fencing token: each was checked against the earlier ones.
    pub fenced: usize,
    /// Sections without a fencing token. Not a violation by itself (without fencing there
    /// are none); the report calls them a problem when the run had fencing on.
    pub unfenced: Vec<Section>,
    /// Fencing tokens out of order on one resource: (the earlier section with the largest
    /// token so far, a later section whose token is not larger).
    pub fencing: Vec<(Section, Section)>,
    /// The smallest `deadline − leave` seen: how close a section came to its deadline.
    pub min_margin_ns: Option<i64>,
    /// The smallest gap between one holder's exit and the next holder's entry.
    pub min_handover_ns: Option<i64>,
    /// The smallest rise of a resource's token from one section to the next (1: the
    /// counters decided; large: the masters' clocks, in µs, did).
    pub min_token_step: Option<u64>,
}

impl Verdict {
    /// Overlaps, late exits and fencing tokens out of order.
    pub fn violations(&self) -> usize {
        self.overlaps.len() + self.late.len() + self.fencing.len()
    }
}

/// Checks the merged sections: no overlap on any resource, every exit before its deadline,
/// and the fencing tokens of each resource strictly increasing in the order the sections
/// were entered (sections without a token are skipped there, and listed).
pub fn check(mut sections: Vec<Section>) -> Verdict {
    let mut v = Verdict {
        sections: sections.len(),
        ..Verdict::default()
    };
    for s in &sections {
        if !s.valid || s.leave_ns >= s.deadline_ns {
            v.late.push(*s);
        }
        let margin = s.deadline_ns - s.leave_ns;
        v.min_margin_ns = Some(v.min_margin_ns.map_or(margin, |m| m.min(margin)));
        match s.token {
            Some(_) => v.fenced += 1,
            None => v.unfenced.push(*s),
        }
    }
    sections.sort_by_key(|s| (s.resource, s.enter_ns, s.leave_ns));
    // Per resource, the section that left last so far: a later entry before its exit is an
    // overlap (comparing with the latest exit, not just the previous one, also catches a
    // section nested inside a long one).
    let mut last: Option<Section> = None;
    // Per resource, the section with the largest token so far: a later token must exceed
    // it (not just the previous one: 5, 3, 4 is two violations, 3 and 4 both come after 5).
    let mut top: Option<Section> = None;
    for s in sections {
        match last {
            Some(l) if l.resource == s.resource => {
                let gap = s.enter_ns - l.leave_ns;
                if gap < 0 {
                    v.overlaps.push((l, s));
                } else {
                    v.min_handover_ns = Some(v.min_handover_ns.map_or(gap, |m| m.min(gap)));
                }
                if s.leave_ns > l.leave_ns {
                    last = Some(s);
                }
            }
            _ => {
                last = Some(s);
                top = None;
            }
        }
        let Some(token) = s.token else { continue };
        match top.and_then(|t| Some((t, t.token?))) {
            Some((t, max)) if token <= max => v.fencing.push((t, s)),
            Some((_, max)) => {
                let step = token - max;
                v.min_token_step = Some(v.min_token_step.map_or(step, |m| m.min(step)));
                top = Some(s);
            }
            None => top = Some(s),
        }
    }
    v
}
