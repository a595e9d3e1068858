//! hawser's write-ahead log: what makes a commit durable.
//!
//! sled makes a batch atomic by sealing and writing one of its I/O buffers for every
//! `apply_batch`, and durable with a `flush` that writes and syncs all of them: the two
//! cost several hundred microseconds of CPU and wall time per commit. [`crate::engine`]
//! therefore writes batches into sled as plain inserts, only once their frames here are
//! durable, and gets atomicity and durability from this log instead (`docs/storage.md`,
//! "Write-ahead log"):
//!
//! ```text
//!  apply(batch)  ──► frame n = encoded batch ──► frame n appended to the pending buffer
//!                                              ─► the batch's puts/deletes in the overlay
//!  flush()       ──► pending buffer written to the open segment, fdatasync   (group commit)
//!                ──► durable batches moved from the overlay into sled, in order (the
//!                    commit log's keys stay here: the engine indexes them by frame)
//!  checkpoint    ──► sled flush; sled's checkpoint := n; whole segments ≤ n removed,
//!                    but none a commit log key is still read from    (every second)
//!  open          ──► redo records of older stores after the checkpoint, then log frames
//!                    after them, re-applied in order; log keys of every kept segment
//!                    indexed; checkpoint; segments without log keys removed; the next
//!                    write starts a fresh segment
//! ```
//!
//! Synced frames are read back by number ([`Wal::read_frame`]): every segment on disk
//! keeps an open handle and the offset of each of its frames.
//!
//! A segment is a file `wal-<first frame, 20 digits>.log` of frames:
//! `[payload length u32 LE, top bit set][crc32 of frame number, durable mark and payload
//! u32 LE][frame number u64 LE][durable mark u64 LE][payload]`, where the durable mark is
//! the last frame known durable when the frame was appended. (Frames of older builds
//! have no mark: the length's top bit is clear and the header is 16 bytes.) Frame
//! numbers are dense across segments, so a reader stops at the first frame that is
//! torn, fails its checksum, or is not the next number.
//!
//! Where the log stops, the marks tell damage from a torn tail: a whole frame further on
//! whose mark covers the frame the log stopped at proves that frame was made durable —
//! acknowledged — so it was damaged since, and opening refuses (`XX001`, naming the file
//! and offset); without such a frame it was never flushed, and is dropped with a
//! warning. A frame's mark is set when it is written (the syncs run under the same lock),
//! and every sync writes a sync mark — a header without payload, numbered
//! [`SYNC_MARK`] — just past the last frame, where the next write overwrites it: the
//! frames of the last flush are covered too, unless a crash of the machine lost the
//! mark with the page cache. A clean close appends an empty frame after the final sync. A gap between segments is damage as well:
//! segments are removed oldest first with the directory synced after each, so no crash
//! leaves one before a gap, and none is ever removed at open for looking cut off.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::WriteBatch;
use crate::error::StoreError;

/// A segment is closed once it holds this much; the next write starts a new one.
pub(crate) const SEGMENT_BYTES: u64 = 64 << 20;
/// Segments are zero-filled ahead of the writes in steps of this much. `fdatasync`
/// of a write that grows a file must also commit the new size, which on ext4 means a
/// journal commit that waits for every other file's dirty data (sled's); a write into
/// space already zero-filled and synced needs none (PostgreSQL preallocates its WAL
/// segments for the same reason). The fill and its sync fall on the commit whose
/// frames cross the filled space, and on every commit sharing its flush, so the step
/// is small enough for that flush not to stand out in the commits' tail and large
/// enough to be rare (docs/storage.md has the measurements).
const ZERO_FILL_BYTES: u64 = 256 << 10;
/// Released segments kept for reuse as new ones (PostgreSQL recycles its WAL segments
/// the same way): a reused file is written to its full size and synced already, so the
/// segment that takes it needs no zero-fill at all. Its old frames stay behind the new
/// ones; readers stop at them, since their numbers are below the next one expected.
const RECYCLE_KEEP: usize = 2;
/// Length, checksum and frame number: the header of frames without a durable mark.
const HEADER_V1_BYTES: usize = 16;
/// Length, checksum, frame number and durable mark.
const HEADER_BYTES: usize = 24;
/// Set in the length of a frame with a durable mark.
const MARKED: u32 = 1 << 31;
/// The number of a sync mark: a header without payload that [`Wal::sync`] writes past
/// the last frame, never a frame's number.
const SYNC_MARK: u64 = u64::MAX;

/// A sync mark saying every frame through `durable` is durable.
fn encode_sync_mark(durable: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES);
    out.extend_from_slice(&MARKED.to_le_bytes());
    out.extend_from_slice(&checksum_marked(SYNC_MARK, durable, &[]).to_le_bytes());
    out.extend_from_slice(&SYNC_MARK.to_le_bytes());
    out.extend_from_slice(&durable.to_le_bytes());
    out
}

/// The frame a whole sync mark at `at` in `bytes` says is durable, if one is there.
fn sync_mark_at(bytes: &[u8], at: usize) -> Option<u64> {
    let h = Header::parse(bytes.get(at..)?)?;
    (h.len == 0 && h.number == SYNC_MARK && h.checks(&[])).then_some(h.durable?)
}
/// Tags of the operations in a payload.
const OP_DELETE: u8 = 0;
const OP_PUT: u8 = 1;

/// Encodes a batch as a frame payload: `[op count u32]` then per operation `[tag u8]
/// [key length u32][key]` and, for a put, `[value length u32][value]` (little endian).
pub(crate) fn encode_batch(batch: &WriteBatch) -> Vec<u8> {
    let ops = batch.ops();
    let mut out = Vec::with_capacity(4 + batch.size_bytes() + ops.len() * 9);
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for (k, v) in ops {
        out.push(if v.is_some() { OP_PUT } else { OP_DELETE });
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k);
        if let Some(v) = v {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(v);
        }
    }
    out
}

/// The batch a payload holds, or what is wrong with it.
pub(crate) fn decode_batch(mut bytes: &[u8]) -> Result<WriteBatch, String> {
    fn take<'a>(bytes: &mut &'a [u8], n: usize, what: &str) -> Result<&'a [u8], String> {
        if bytes.len() < n {
            return Err(format!("{what} runs past the end of the frame"));
        }
        let (head, rest) = bytes.split_at(n);
        *bytes = rest;
        Ok(head)
    }
    fn len(bytes: &mut &[u8], what: &str) -> Result<usize, String> {
        let b = take(bytes, 4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    }
    let count = len(&mut bytes, "operation count")?;
    let mut batch = WriteBatch::new();
    for i in 0..count {
        let tag = take(&mut bytes, 1, "operation tag")?[0];
        let klen = len(&mut bytes, "key length")?;
        let key = take(&mut bytes, klen, "key")?.to_vec();
        match tag {
            OP_PUT => {
                let vlen = len(&mut bytes, "value length")?;
                batch.put(key, take(&mut bytes, vlen, "value")?.to_vec());
            }
            OP_DELETE => batch.delete(key),
            t => return Err(format!("operation {i} has unknown tag {t}")),
        }
    }
    if !bytes.is_empty() {
        return Err(format!("{} bytes after the last operation", bytes.len()));
    }
    Ok(batch)
}

fn checksum(frame: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&frame.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn checksum_marked(frame: u64, durable: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&frame.to_le_bytes());
    h.update(&durable.to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// A frame header as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Header {
    len: usize,
    crc: u32,
    number: u64,
    /// The durable mark; `None` for a frame of an older build.
    durable: Option<u64>,
}

impl Header {
    /// Reads the header at the start of `bytes`, if they hold one.
    fn parse(bytes: &[u8]) -> Option<Header> {
        if bytes.len() < HEADER_V1_BYTES {
            return None;
        }
        let word = |i: usize| u32::from_le_bytes(bytes[i..i + 4].try_into().expect("4 bytes"));
        let long = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let (len, crc, number) = (word(0), word(4), long(8));
        if len & MARKED == 0 {
            return Some(Header {
                len: len as usize,
                crc,
                number,
                durable: None,
            });
        }
        if bytes.len() < HEADER_BYTES {
            return None;
        }
        Some(Header {
            len: (len & !MARKED) as usize,
            crc,
            number,
            durable: Some(long(16)),
        })
    }

    fn size(&self) -> usize {
        match self.durable {
            Some(_) => HEADER_BYTES,
            None => HEADER_V1_BYTES,
        }
    }

    /// Whether `payload` is the one this header was written with.
    fn checks(&self, payload: &[u8]) -> bool {
        let crc = match self.durable {
            Some(d) => checksum_marked(self.number, d, payload),
            None => checksum(self.number, payload),
        };
        crc == self.crc
    }
}

/// A whole frame of a segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameAt<'a> {
    /// Its offset in the segment.
    at: u64,
    number: u64,
    durable: Option<u64>,
    payload: &'a [u8],
}

impl FrameAt<'_> {
    /// The offset just after it.
    fn end(&self) -> u64 {
        let header = if self.durable.is_some() {
            HEADER_BYTES
        } else {
            HEADER_V1_BYTES
        };
        self.at + (header + self.payload.len()) as u64
    }
}

/// The whole frame at `at` in `bytes`, if one is there.
fn frame_at(bytes: &[u8], at: usize) -> Option<FrameAt<'_>> {
    let h = Header::parse(bytes.get(at..)?)?;
    let start = at + h.size();
    let end = start.checked_add(h.len)?;
    if h.len == 0 || end > bytes.len() {
        return None;
    }
    let payload = &bytes[start..end];
    h.checks(payload).then_some(FrameAt {
        at: at as u64,
        number: h.number,
        durable: h.durable,
        payload,
    })
}

/// How a segment's run of frames ends at offset `stop`, where frame `next` would be.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// At the end of the file, at zeros (space filled ahead), or at a frame of a lower
    /// number (what a reused segment held before).
    Clean,
    /// Something else is there, and no later frame says frame `next` was ever durable:
    /// a write a crash cut short.
    Torn,
    /// A later whole frame (`number`; [`SYNC_MARK`] for a sync mark), at offset `at`,
    /// has a durable mark (`durable`) at or past `next`: frame `next` was durable, and
    /// is damaged.
    Damaged { number: u64, at: u64, durable: u64 },
}

/// See [`End`].
fn end_at(bytes: &[u8], stop: u64, next: u64) -> End {
    let stop = stop as usize;
    let rest = &bytes[stop.min(bytes.len())..];
    if sync_mark_at(bytes, stop).is_some() {
        return End::Clean;
    }
    // Zeros are where the writes had not reached yet — unless a later frame says they
    // had (a flushed frame zeroed since), so the search below runs for them too.
    // A later frame that says `next` was durable, anywhere past the stop (the length
    // of the frame there may be what is damaged, so every offset is tried).
    for at in stop + 1..bytes.len().saturating_sub(HEADER_BYTES) {
        let Some(h) = Header::parse(&bytes[at..]) else {
            continue;
        };
        let Some(durable) = h.durable else {
            continue;
        };
        if h.number <= next || durable < next || durable >= h.number {
            continue;
        }
        if h.number == SYNC_MARK {
            if sync_mark_at(bytes, at).is_some() {
                return End::Damaged {
                    number: SYNC_MARK,
                    at: at as u64,
                    durable,
                };
            }
            continue;
        }
        if let Some(f) = frame_at(bytes, at) {
            return End::Damaged {
                number: f.number,
                at: f.at,
                durable,
            };
        }
    }
    let head = &rest[..rest.len().min(HEADER_BYTES)];
    if head.iter().all(|&b| b == 0) {
        return End::Clean;
    }
    match Header::parse(rest) {
        Some(h) if h.number < next => End::Clean,
        _ => End::Torn,
    }
}

fn segment_name(first_frame: u64) -> String {
    format!("wal-{first_frame:020}.log")
}

/// The name a released segment waits for reuse under (not a segment's: [`segments`]
/// skips it): `wal-<first>.log` becomes `recycle-<first>.wal`.
fn recycle_name_of(segment: &Path) -> String {
    let name = segment
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let first = name
        .strip_prefix("wal-")
        .and_then(|n| n.strip_suffix(".log"))
        .unwrap_or(name);
    format!("recycle-{first}.wal")
}

/// The segments in `dir`, oldest first, as `(first frame, path)`.
pub(crate) fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut found = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(StoreError::io(format!("listing {}", dir.display()), e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let first = name
            .strip_prefix("wal-")
            .and_then(|n| n.strip_suffix(".log"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(first) = first {
            found.push((first, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// A segment found on disk by [`scan`]: its first frame, its path, and where each of
/// its whole frames starts.
pub(crate) struct ScannedSegment {
    pub(crate) first: u64,
    pub(crate) path: PathBuf,
    /// File offset of frame `first + i`.
    pub(crate) offsets: Vec<u64>,
}

impl ScannedSegment {
    /// The number of its last whole frame (`first - 1` when it holds none).
    pub(crate) fn last(&self) -> u64 {
        self.first + self.offsets.len() as u64 - 1
    }
}

/// What [`scan`] found: the segments of the log, which continue one another, and the
/// stale ones after it: segments that hold no frame (created, or a released one
/// renamed for reuse, just before a crash).
pub(crate) struct Scanned {
    pub(crate) segments: Vec<ScannedSegment>,
    pub(crate) stale: Vec<PathBuf>,
    /// With `salvage`: the damage the log was cut at, and where what followed it went.
    pub(crate) salvaged: Option<String>,
}

/// Where a damaged log is cut when it is salvaged: the segment `keep` (by index in
/// the listing) keeps its first `keep_bytes` (all of it, moved aside, when 0), and
/// every segment after it is moved aside.
struct Cut {
    keep: usize,
    keep_bytes: u64,
}

/// Reads the log in `dir` once, from its oldest segment on, and hands every frame of
/// the log to `visit`, in order (`(frame, payload)`). Reading stops at the end of the
/// log: in its last segment, at zeros, at a frame of a lower number (a reused segment's
/// old bytes), or at a torn frame — a frame no later frame's durable mark covers, so it
/// was never flushed, dropped with a warning naming it.
///
/// Damage is refused, naming the file and offset (`XX001`; no file is removed): a frame
/// the log stops at that a later frame's mark says was durable (damaged since it was
/// flushed); a log that ends before `durable_through` (the store's checkpoint: frames
/// through it were durable and applied); a segment that stops before the frame the
/// next segment starts at (a new segment is created only once the frames of the one
/// before are durable; bytes a reused segment held before, behind its last frame, are
/// no loss when the next segment goes on from there); a gap in
/// the frame numbers between two segments (segments are removed oldest first, the
/// directory synced after each, so no crash leaves a gap behind). With `salvage` the
/// log is cut there instead: the intact frames before the damage stay the log, and
/// everything from the damage on — the rest of that segment and every segment after —
/// is copied into `salvaged-<unix seconds>/` beside the segments and taken out of the
/// log ([`Scanned::salvaged`] says what and where).
pub(crate) fn scan(
    dir: &Path,
    salvage: bool,
    durable_through: u64,
    mut visit: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
) -> Result<Scanned, StoreError> {
    let mut found = Scanned {
        segments: Vec::new(),
        stale: Vec::new(),
        salvaged: None,
    };
    let all = segments(dir)?;
    // How the last segment of the log read so far ends: where, and how.
    let mut tail: Option<(u64, End)> = None;
    // The listing index of the segment `tail` is about.
    let mut tail_index = 0;
    // The listing index and first frame of the first segment without a whole frame.
    let mut first_stale: Option<(usize, u64)> = None;
    let mut cut: Option<(StoreError, Cut)> = None;
    for (i, (first, path)) in all.iter().enumerate() {
        let (first, path) = (*first, path.clone());
        let bytes = read_segment(&path)?;
        let frames: Vec<FrameAt<'_>> = frames_in(first, &bytes).collect();
        if frames.is_empty() {
            match end_at(&bytes, 0, first) {
                // Created just before a crash (or reused): nothing in it yet.
                End::Clean | End::Torn => {
                    first_stale.get_or_insert((i, first));
                    found.stale.push(path);
                    continue;
                }
                damaged @ End::Damaged { .. } => {
                    let e = damaged_error(dir, &path, 0, first, &damaged);
                    cut = Some((
                        e,
                        Cut {
                            keep: i,
                            keep_bytes: 0,
                        },
                    ));
                    break;
                }
            }
        }
        if let Some(stale) = found.stale.first() {
            let e = StoreError::DamagedLog(format!(
                "{} holds no whole frame, but {} after it holds frames {first} on: {}",
                file_name(stale),
                file_name(&path),
                WAYS_OUT
            ));
            let keep = i - found.stale.len();
            found.stale.clear();
            cut = Some((
                e,
                Cut {
                    keep,
                    keep_bytes: 0,
                },
            ));
            break;
        }
        if let (Some(last), Some((stop, end))) = (found.segments.last(), &tail) {
            let e = if *end == End::Clean && last.last() + 1 != first {
                Some(StoreError::DamagedLog(format!(
                    "the log in {} has a gap: {} ends at frame {}, {} after it starts at \
                     frame {first}; frames {} to {} are missing (a segment removed by hand, \
                     or put back from elsewhere). No file was removed: {}",
                    dir.display(),
                    file_name(&last.path),
                    last.last(),
                    file_name(&path),
                    last.last() + 1,
                    first - 1,
                    WAYS_OUT
                )))
            } else if last.last() + 1 != first {
                // A torn end (`*end == End::Torn`) followed by the next frame number is
                // no loss: bytes a segment held from its earlier use lie behind its last
                // frame, not on a frame boundary, and the writer went on in a new one.
                Some(StoreError::DamagedLog(format!(
                    "the log in {} stops short: {} ends at frame {} (offset {stop}: \
                     the next frame there is torn, fails its check or has the wrong \
                     number), but {} after it holds frames {first} to {}; frames in \
                     between are missing. No file was removed: {}",
                    dir.display(),
                    file_name(&last.path),
                    last.last(),
                    file_name(&path),
                    frames.last().map_or(first, |f| f.number),
                    WAYS_OUT
                )))
            } else {
                None
            };
            if let Some(e) = e {
                // The previous segment keeps what it holds up to where it stopped.
                cut = Some((
                    e,
                    Cut {
                        keep: i - 1,
                        keep_bytes: *stop,
                    },
                ));
                break;
            }
        }
        let stop = frames.last().map_or(0, FrameAt::end);
        let next = first + frames.len() as u64;
        let end = end_at(&bytes, stop, next);
        let damaged = matches!(end, End::Damaged { .. });
        if damaged && !salvage {
            return Err(damaged_error(dir, &path, stop, next, &end));
        }
        for f in &frames {
            visit(f.number, f.payload)?;
        }
        found.segments.push(ScannedSegment {
            first,
            path: path.clone(),
            offsets: frames.iter().map(|f| f.at).collect(),
        });
        if damaged {
            let e = damaged_error(dir, &path, stop, next, &end);
            cut = Some((
                e,
                Cut {
                    keep: i,
                    keep_bytes: stop,
                },
            ));
            break;
        }
        tail = Some((stop, end));
        tail_index = i;
    }
    // Where the log ends, and where a salvage cuts it if that is before the checkpoint:
    // after the last whole frame, or (when the segments after it hold none) at the
    // first of those, which was created for the next frame.
    let end = match (found.segments.last(), &tail, first_stale) {
        (_, _, Some((i, first))) => Some((first - 1, i, 0, all[i].1.clone())),
        (Some(last), Some((stop, _)), None) => {
            Some((last.last(), tail_index, *stop, last.path.clone()))
        }
        _ => None,
    };
    if let (None, Some((ends_at, keep, keep_bytes, path))) = (&cut, end) {
        if ends_at < durable_through {
            let e = StoreError::DamagedLog(format!(
                "the log in {} ends at frame {ends_at} (offset {keep_bytes} of {}), but the \
                 store's checkpoint says every frame through {durable_through} was durable: \
                 frames {} to {durable_through} were flushed and are gone (a segment \
                 truncated or zeroed). Nothing was removed: {WAYS_OUT}",
                dir.display(),
                file_name(&path),
                ends_at + 1,
            ));
            cut = Some((e, Cut { keep, keep_bytes }));
        }
    }
    if let Some((e, at)) = cut {
        if !salvage {
            return Err(e);
        }
        found.salvaged = Some(salvage_at(dir, &all, &at, &e)?);
        if at.keep_bytes == 0 {
            found.segments.retain(|s| s.path != all[at.keep].1);
        }
        return Ok(found);
    }
    if let (Some(last), Some((stop, End::Torn))) = (found.segments.last(), &tail) {
        tracing::warn!(
            segment = %file_name(&last.path),
            offset = stop,
            frame = last.last() + 1,
            "the write-ahead log ends in a torn frame: a write a crash cut short, never \
             flushed (no later frame says it was durable); dropped"
        );
    }
    Ok(found)
}

/// Cuts the log at `cut` (see [`Cut`]): copies what goes into a `salvaged-…` directory
/// beside the segments, then truncates the segment cut in (or moves it whole) and
/// moves every later segment, syncing as it goes. Returns what it did, for the log.
fn salvage_at(
    dir: &Path,
    all: &[(u64, PathBuf)],
    cut: &Cut,
    damage: &StoreError,
) -> Result<String, StoreError> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let aside = dir.join(format!("salvaged-{secs}"));
    fs::create_dir_all(&aside)
        .map_err(|e| StoreError::io(format!("creating {}", aside.display()), e))?;
    let io = |what: String| move |e| StoreError::io(what, e);
    let (_, cut_path) = &all[cut.keep];
    let to = aside.join(cut_path.file_name().unwrap_or_default());
    if cut.keep_bytes == 0 {
        fs::rename(cut_path, &to).map_err(io(format!("moving {}", cut_path.display())))?;
    } else {
        fs::copy(cut_path, &to).map_err(io(format!("copying {}", cut_path.display())))?;
        File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(io(format!("syncing {}", to.display())))?;
        sync_dir(&aside)?;
        let f = OpenOptions::new()
            .write(true)
            .open(cut_path)
            .map_err(io(format!("opening {}", cut_path.display())))?;
        f.set_len(cut.keep_bytes)
            .and_then(|()| f.sync_all())
            .map_err(io(format!("truncating {}", cut_path.display())))?;
    }
    let mut moved = vec![file_name(cut_path).to_string()];
    for (_, path) in &all[cut.keep + 1..] {
        let to = aside.join(path.file_name().unwrap_or_default());
        fs::rename(path, &to).map_err(io(format!("moving {}", path.display())))?;
        moved.push(file_name(path).to_string());
    }
    sync_dir(&aside)?;
    sync_dir(dir)?;
    let what = format!(
        "{damage} — salvaged: the log now ends before the damage (in {} at offset {}); \
         {} copied into {} as they were",
        file_name(cut_path),
        cut.keep_bytes,
        moved.join(", "),
        aside.display()
    );
    tracing::error!(what = %what, "the write-ahead log was salvaged");
    Ok(what)
}

/// What to do about a damaged log.
const WAYS_OUT: &str = "restore the data directory from a backup, or move it aside and \
    rebuild this node from a peer (start it on an empty data directory, then `hawser \
    duplicate`), or start it with --salvage to keep the commits before the damage \
    (those after it are then lost here, and kept aside)";

/// The error of a frame found damaged ([`End::Damaged`]).
fn damaged_error(dir: &Path, path: &Path, stop: u64, next: u64, end: &End) -> StoreError {
    let End::Damaged {
        number,
        at,
        durable,
    } = end
    else {
        unreachable!("only damage is an error here");
    };
    let by = match *number {
        SYNC_MARK => "the sync mark".to_string(),
        n => format!("frame {n}"),
    };
    StoreError::DamagedLog(format!(
        "frame {next} at offset {stop} of {} (in {}) is torn or fails its check, but \
         {by} at offset {at} says every frame through {durable} was durable: it was \
         acknowledged and damaged since. Nothing was removed: {WAYS_OUT}",
        file_name(path),
        dir.display()
    ))
}

fn file_name(path: &Path) -> std::borrow::Cow<'_, str> {
    path.file_name()
        .unwrap_or(path.as_os_str())
        .to_string_lossy()
}

/// Appends frame `frame` with `payload` to `buf`, as segments hold it, with durable mark
/// `durable` (the log's frames get theirs again when written: [`stamp_frames`]).
fn encode_frame(buf: &mut Vec<u8>, frame: u64, durable: u64, payload: &[u8]) {
    debug_assert!((payload.len() as u64) < u64::from(MARKED));
    buf.reserve(HEADER_BYTES + payload.len());
    buf.extend_from_slice(&(payload.len() as u32 | MARKED).to_le_bytes());
    buf.extend_from_slice(&checksum_marked(frame, durable, payload).to_le_bytes());
    buf.extend_from_slice(&frame.to_le_bytes());
    buf.extend_from_slice(&durable.to_le_bytes());
    buf.extend_from_slice(payload);
}

fn read_segment(path: &Path) -> Result<Vec<u8>, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|e| StoreError::io(format!("reading {}", path.display()), e))?;
    Ok(bytes)
}

/// The whole frames at the start of a segment's `bytes`, numbered on from `first`.
/// They end at zeros (space filled ahead of writes), at a frame torn by a crash or
/// failing its checksum, or at a frame that is not the next number (what a reused
/// segment held before).
fn frames_in(first: u64, bytes: &[u8]) -> impl Iterator<Item = FrameAt<'_>> {
    let mut at = 0usize;
    let mut next = first;
    std::iter::from_fn(move || {
        let f = frame_at(bytes, at).filter(|f| f.number == next)?;
        next += 1;
        at = f.end() as usize;
        Some(f)
    })
}

/// Hands every frame of the log in `dir` numbered above `after` to `apply`, in order
/// ([`scan`]); returns the last one handed over, if any.
///
/// A log whose frames start beyond `after + 1` would leave a hole between what the
/// store has and what the log holds: that is refused, naming both.
#[cfg(test)]
pub(crate) fn replay(
    dir: &Path,
    after: u64,
    mut apply: impl FnMut(u64, &[u8]) -> Result<(), StoreError>,
) -> Result<Option<u64>, StoreError> {
    let mut last = None;
    scan(dir, false, 0, |frame, payload| {
        if frame <= after {
            return Ok(());
        }
        check_continues(dir, after, last, frame)?;
        apply(frame, payload)?;
        last = Some(frame);
        Ok(())
    })?;
    Ok(last)
}

/// Refuses a first frame past `after` that is not `after + 1`: the frames in between
/// are neither in the store nor in the log.
pub(crate) fn check_continues(
    dir: &Path,
    after: u64,
    last: Option<u64>,
    frame: u64,
) -> Result<(), StoreError> {
    if last.is_none() && frame != after + 1 {
        return Err(StoreError::DamagedLog(format!(
            "the write-ahead log in {} continues at frame {frame} but the store \
             holds frames only up to {after}: frames in between are missing",
            dir.display()
        )));
    }
    Ok(())
}

/// Frames appended but not yet written.
#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    /// Number of the first and last frame in `buf`.
    first: u64,
    last: u64,
    /// Per frame in `buf`: its offset there and the checksum state of its payload. Its
    /// durable mark and checksum are set when it is written ([`stamp_frames`]): the
    /// last sync then is the one that made every earlier frame durable, acknowledged
    /// or not, so a crash right after the write still leaves them covered.
    frames: Vec<(usize, crc32fast::Hasher)>,
}

/// Sets the durable mark of every frame in `buf` (see [`Pending::frames`]) to
/// `durable`, and its checksum with it.
fn stamp_frames(buf: &mut [u8], frames: &[(usize, crc32fast::Hasher)], durable: u64) {
    for (at, payload) in frames {
        let number: [u8; 8] = buf[at + 8..at + 16].try_into().expect("8 bytes");
        let mut h = crc32fast::Hasher::new();
        h.update(&number);
        h.update(&durable.to_le_bytes());
        h.combine(payload);
        buf[at + 4..at + 8].copy_from_slice(&h.finalize().to_le_bytes());
        buf[at + 16..at + 24].copy_from_slice(&durable.to_le_bytes());
    }
}

/// The segment being written.
struct Open {
    file: Arc<File>,
    /// Its first frame.
    first: u64,
    /// Where the next frame goes.
    len: u64,
    /// The file is written and synced up to here — zero-filled, or a reused segment's
    /// old frames — so a write below it changes no file size.
    zeroed: u64,
    /// A cleared buffer handed back to `pending` after a write, to keep its capacity.
    spare: Vec<u8>,
}

/// A segment on disk, as readers use it.
struct Segment {
    path: PathBuf,
    file: Arc<File>,
    /// File offset of frame `first + i`, for every frame written.
    offsets: Vec<u64>,
}

/// The appending side of the log: frames go into a buffer; [`Wal::sync`] writes the
/// buffer and syncs it, for every frame appended so far (group commit);
/// [`Wal::write_ahead`] only writes it. Written frames can be read back by number
/// ([`Wal::read_frame`]) until their segment is released.
pub(crate) struct Wal {
    dir: PathBuf,
    pending: Mutex<Pending>,
    /// `None` until the first write opens a segment.
    open: Mutex<Option<Open>>,
    /// Every segment on disk by first frame, the one being written included.
    segments: RwLock<BTreeMap<u64, Segment>>,
    /// The last frame written to its segment; the frames after `synced` up to it
    /// are in the kernel's cache, not yet known on disk.
    written: AtomicU64,
    /// The last frame known durable.
    synced: AtomicU64,
    /// Set by the first failed write or sync; every later sync fails with it, since
    /// what reached the disk is no longer known (the node needs a restart, which
    /// recovers from the log and sled).
    failed: Mutex<Option<String>>,
    /// Released segments waiting to be reused ([`RECYCLE_KEEP`] at most).
    recycled: Mutex<Vec<PathBuf>>,
}

impl Wal {
    /// A log in `dir` holding no segment yet, whose next frame is `next_frame`.
    #[cfg(test)]
    pub(crate) fn new(dir: &Path, next_frame: u64) -> Result<Self, StoreError> {
        Self::open(dir, next_frame, Vec::new())
    }

    /// The log in `dir` whose next frame is `next_frame`, keeping the segments
    /// `kept` (found by [`scan`], every frame below `next_frame`) readable. The next
    /// write starts a new segment.
    pub(crate) fn open(
        dir: &Path,
        next_frame: u64,
        kept: Vec<ScannedSegment>,
    ) -> Result<Self, StoreError> {
        fs::create_dir_all(dir)
            .map_err(|e| StoreError::io(format!("creating {}", dir.display()), e))?;
        let mut segments = BTreeMap::new();
        for s in kept {
            debug_assert!(
                s.last() < next_frame,
                "kept segments end before the next frame"
            );
            let file = File::open(&s.path)
                .map_err(|e| StoreError::io(format!("opening {}", s.path.display()), e))?;
            segments.insert(
                s.first,
                Segment {
                    path: s.path,
                    file: Arc::new(file),
                    offsets: s.offsets,
                },
            );
        }
        let recycled = recycled_in(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            recycled: Mutex::new(recycled),
            pending: Mutex::new(Pending {
                buf: Vec::new(),
                first: next_frame,
                last: next_frame - 1,
                frames: Vec::new(),
            }),
            open: Mutex::new(None),
            segments: RwLock::new(segments),
            written: AtomicU64::new(next_frame - 1),
            synced: AtomicU64::new(next_frame - 1),
            failed: Mutex::new(None),
        })
    }

    /// Appends frame `frame` (the next number) holding `payload`. Not written yet.
    pub(crate) fn append(&self, frame: u64, payload: &[u8]) {
        let mut p = self.pending.lock();
        debug_assert_eq!(frame, p.last + 1, "frames are appended in order");
        if p.buf.is_empty() {
            p.first = frame;
        }
        let at = p.buf.len();
        // The mark is set when the frame is written (`write_pending`).
        encode_frame(&mut p.buf, frame, 0, payload);
        let mut h = crc32fast::Hasher::new();
        h.update(payload);
        p.frames.push((at, h));
        p.last = frame;
    }

    /// At a clean close, after the final sync: appends frame `frame`, an empty batch,
    /// and syncs it, so that its durable mark covers the log's last real frame — damage
    /// to that frame is then told from a torn write at the next open. Nothing when no
    /// frame was written since the log was opened (the log ends as it did). Whether it
    /// appended.
    pub(crate) fn seal(&self, frame: u64) -> Result<bool, StoreError> {
        if self.open.lock().is_none() && self.pending_bytes() == 0 {
            return Ok(false);
        }
        self.sync()?;
        self.append(frame, &encode_batch(&WriteBatch::new()));
        self.sync()?;
        Ok(true)
    }

    /// Bytes appended and not yet written.
    pub(crate) fn pending_bytes(&self) -> usize {
        self.pending.lock().buf.len()
    }

    /// Writes and syncs every frame appended before this call. Concurrent callers
    /// queue on the write; the one behind usually finds its frames written by the one
    /// ahead.
    pub(crate) fn sync(&self) -> Result<(), StoreError> {
        let mut open = self.open.lock();
        self.write_pending(&mut open)?;
        let written = self.written.load(Ordering::Acquire);
        if written <= self.synced() {
            return Ok(());
        }
        let o = open
            .as_ref()
            .expect("frames were written, so a segment is open");
        if let Err(e) = o.file.sync_data() {
            let path = self.dir.join(segment_name(o.first));
            return Err(self.fail(StoreError::io(format!("syncing {}", path.display()), e)));
        }
        self.synced.store(written, Ordering::Release);
        // Past the last frame, where the next write goes (it overwrites it): every
        // frame through `written` is durable. Damage to the last flush's frames is then
        // told from a torn write at the next open as long as the mark is there — a
        // crash of this process keeps it unsynced; a crash of the machine may lose it,
        // and then nothing can tell. Written into space already filled, so it changes
        // no file size; a failed write only loses the mark.
        if o.len + HEADER_BYTES as u64 <= o.zeroed {
            let _ = o.file.write_all_at(&encode_sync_mark(written), o.len);
        }
        Ok(())
    }

    /// Writes every frame appended before this call to its segment without syncing
    /// it: readers find the frames, and a crash of this process alone (not of the
    /// machine) keeps them, since the kernel holds what was written. [`Wal::sync`]
    /// makes them durable.
    pub(crate) fn write_ahead(&self) -> Result<(), StoreError> {
        let mut open = self.open.lock();
        self.write_pending(&mut open)
    }

    /// The last frame written to its segment (durable or not).
    #[cfg(test)]
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    fn write_pending(&self, open: &mut Option<Open>) -> Result<(), StoreError> {
        if let Some(reason) = self.failed.lock().clone() {
            return Err(StoreError::io(
                "write-ahead log",
                std::io::Error::other(format!("an earlier write failed: {reason}")),
            ));
        }
        let (mut buf, first, last) = {
            let mut p = self.pending.lock();
            if p.buf.is_empty() {
                return Ok(());
            }
            let spare = open.as_mut().map(|o| std::mem::take(&mut o.spare));
            let mut buf = std::mem::replace(&mut p.buf, spare.unwrap_or_default());
            // The syncs run under the same lock as this write: `synced` is final here.
            stamp_frames(&mut buf, &p.frames, self.synced());
            p.frames.clear();
            (buf, p.first, p.last)
        };
        match self.write(open, &buf, first) {
            Ok(()) => {
                self.written.store(last, Ordering::Release);
                buf.clear();
                if let Some(o) = open.as_mut() {
                    o.spare = buf;
                }
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    /// The first failed write or sync, if one failed.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failed.lock().clone()
    }

    /// Records the first failed write or sync (see `failed`) and returns it.
    fn fail(&self, e: StoreError) -> StoreError {
        self.failed.lock().get_or_insert_with(|| e.to_string());
        e
    }

    fn write(&self, open: &mut Option<Open>, buf: &[u8], first: u64) -> Result<(), StoreError> {
        let roll = match open {
            None => true,
            Some(o) => o.len > 0 && o.len + buf.len() as u64 > SEGMENT_BYTES,
        };
        if roll {
            if let Some(o) = open.as_ref() {
                // Frames written ahead into the old segment become durable before
                // the new one takes the next: a sync covers only its own file.
                if self.written.load(Ordering::Acquire) > self.synced() {
                    o.file.sync_data().map_err(|e| {
                        let path = self.dir.join(segment_name(o.first));
                        StoreError::io(format!("syncing {}", path.display()), e)
                    })?;
                    self.synced
                        .store(self.written.load(Ordering::Acquire), Ordering::Release);
                }
            }
            let path = self.dir.join(segment_name(first));
            let recycled = self.recycled.lock().pop();
            let (file, zeroed) = match recycled.map(|old| reuse(&old, &path)) {
                Some(Ok(reused)) => reused,
                failed => {
                    if let Some(Err(e)) = failed {
                        tracing::warn!(error = %e, "could not reuse a released log segment; creating one");
                    }
                    let file = OpenOptions::new()
                        .create(true)
                        .truncate(true)
                        .read(true)
                        .write(true)
                        .open(&path)
                        .map_err(|e| StoreError::io(format!("creating {}", path.display()), e))?;
                    (file, 0)
                }
            };
            // The new name must survive a crash before frames in it count as durable.
            sync_dir(&self.dir)?;
            let file = Arc::new(file);
            self.segments.write().insert(
                first,
                Segment {
                    path,
                    file: file.clone(),
                    offsets: Vec::new(),
                },
            );
            let spare = open.take().map(|o| o.spare).unwrap_or_default();
            *open = Some(Open {
                file,
                first,
                len: 0,
                zeroed,
                spare,
            });
        }
        let o = open.as_mut().expect("a segment is open");
        let (seg_first, at) = (o.first, o.len);
        let end = at + buf.len() as u64;
        let failed = |what: &str, e| {
            let path = self.dir.join(segment_name(seg_first));
            StoreError::io(format!("{what} {}", path.display()), e)
        };
        if end > o.zeroed {
            // Zero-fill ahead: this sync commits the new size once, the next ones
            // only write data.
            let to = end.next_multiple_of(ZERO_FILL_BYTES) + ZERO_FILL_BYTES;
            write_zeros(&o.file, o.zeroed, to).map_err(|e| failed("extending", e))?;
            o.zeroed = to;
        }
        o.file
            .write_all_at(buf, at)
            .map_err(|e| failed("writing", e))?;
        o.len = end;
        // Readers find the frames from here on.
        let mut segments = self.segments.write();
        let offsets = &mut segments
            .get_mut(&seg_first)
            .expect("the open segment is listed")
            .offsets;
        let mut rel = 0usize;
        while rel < buf.len() {
            offsets.push(at + rel as u64);
            let h = Header::parse(&buf[rel..]).expect("frames this log encoded");
            rel += h.size() + h.len;
        }
        Ok(())
    }

    /// The last frame known durable in the log.
    pub(crate) fn synced(&self) -> u64 {
        self.synced.load(Ordering::Acquire)
    }

    /// The payload of written frame `frame`, read back from its segment; `None` when
    /// its segment was released.
    pub(crate) fn read_frame(&self, frame: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let (file, offset, first) = {
            let segments = self.segments.read();
            let Some((&first, seg)) = segments.range(..=frame).next_back() else {
                return Ok(None);
            };
            let Some(&offset) = usize::try_from(frame - first)
                .ok()
                .and_then(|i| seg.offsets.get(i))
            else {
                return Ok(None);
            };
            (seg.file.clone(), offset, first)
        };
        let path = || self.dir.join(segment_name(first));
        let failed = |e| StoreError::io(format!("reading {}", path().display()), e);
        // A frame of an older build has the shorter header, and may end the file.
        let mut header = [0u8; HEADER_BYTES];
        let mut got = 0;
        while got < HEADER_BYTES {
            match file.read_at(&mut header[got..], offset + got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(failed(e)),
            }
        }
        let h = Header::parse(&header[..got]).ok_or_else(|| {
            StoreError::corrupt(
                &frame.to_be_bytes(),
                format!(
                    "frame {frame} at offset {offset} of {} has no whole header",
                    path().display()
                ),
            )
        })?;
        let mut payload = vec![0u8; h.len];
        file.read_exact_at(&mut payload, offset + h.size() as u64)
            .map_err(failed)?;
        if h.number != frame || !h.checks(&payload) {
            return Err(StoreError::corrupt(
                &frame.to_be_bytes(),
                format!(
                    "frame {frame} at offset {offset} of {} fails its check (it was written \
                     there)",
                    path().display()
                ),
            ));
        }
        Ok(Some(payload))
    }

    /// Removes the segments, other than the one being written, whose frames are all at
    /// or below `frame` (nothing needs them any more): up to [`RECYCLE_KEEP`] are kept
    /// for reuse under another name. The directory is synced after: a removal a crash
    /// undid would bring an old segment back before a gap in the frames, which the
    /// next open would take for the end of the log.
    pub(crate) fn release_through(&self, frame: u64) -> Result<(), StoreError> {
        let gone: Vec<Segment> = {
            // The writer's lock only to know the open segment: the files are renamed,
            // removed and the directory synced without holding up commits.
            let open = self.open.lock();
            let current = open.as_ref().map(|o| o.first);
            let mut segments = self.segments.write();
            let mut gone = Vec::new();
            let mut iter = segments.iter().peekable();
            while let Some((&first, seg)) = iter.next() {
                // A segment ends where the next one begins, the last one at its last
                // frame.
                let last = match iter.peek() {
                    Some((&next_first, _)) => next_first - 1,
                    None => first + seg.offsets.len() as u64 - 1,
                };
                if last > frame || Some(first) == current {
                    break;
                }
                gone.push(first);
            }
            gone.into_iter()
                .map(|first| segments.remove(&first).expect("listed"))
                .collect()
        };
        if gone.is_empty() {
            return Ok(());
        }
        // Oldest first, the directory synced after each: whatever part of the changes
        // a crash keeps, the segments left continue one another (a gap is damage to
        // the next open).
        for Segment { path, .. } in gone {
            let keep = self.recycled.lock().len() < RECYCLE_KEEP;
            if keep {
                let to = self.dir.join(recycle_name_of(&path));
                fs::rename(&path, &to).map_err(|e| {
                    StoreError::io(format!("renaming {} for reuse", path.display()), e)
                })?;
                self.recycled.lock().push(to);
            } else {
                fs::remove_file(&path)
                    .map_err(|e| StoreError::io(format!("removing {}", path.display()), e))?;
            }
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

/// Zeros to fill segments with, from a static block rather than a fresh buffer: a
/// zeroed allocation of a fill's size was new memory every time (the allocator hands
/// large blocks back to the kernel), faulted in, often as a huge page the kernel
/// cleared, on the commit that crossed the filled space.
static ZEROS: [u8; 64 << 10] = [0; 64 << 10];

/// Writes zeros to `file` from offset `from` up to `to`.
fn write_zeros(file: &File, from: u64, to: u64) -> std::io::Result<()> {
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// A released segment `old` renamed to `path` and opened as a new segment, with its
/// length: written and synced up to there when it was a segment.
fn reuse(old: &Path, path: &Path) -> std::io::Result<(File, u64)> {
    fs::rename(old, path)?;
    let file = OpenOptions::new().read(true).write(true).open(path)?;
    let len = file.metadata()?.len();
    Ok((file, len))
}

/// The released segments a previous run left in `dir` for reuse, [`RECYCLE_KEEP`] at
/// most; the others are removed.
fn recycled_in(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut found = Vec::new();
    let entries =
        fs::read_dir(dir).map_err(|e| StoreError::io(format!("listing {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| StoreError::io(format!("listing {}", dir.display()), e))?;
        let name = entry.file_name();
        let is_recycled = name
            .to_str()
            .is_some_and(|n| n.starts_with("recycle-") && n.ends_with(".wal"));
        if is_recycled {
            found.push(entry.path());
        }
    }
    found.sort();
    for extra in found.split_off(found.len().min(RECYCLE_KEEP)) {
        fs::remove_file(&extra)
            .map_err(|e| StoreError::io(format!("removing {}", extra.display()), e))?;
    }
    Ok(found)
}

/// Makes the directory's entries (a created segment's name) durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(format!("syncing directory {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(i: u8) -> WriteBatch {
        let mut b = WriteBatch::new();
        b.put(vec![b'k', i], vec![i; (i as usize) * 7 % 50]);
        b.delete(vec![b'd', i]);
        b.put(vec![], vec![]);
        b
    }

    fn read_all(dir: &Path, after: u64) -> Result<Vec<(u64, WriteBatch)>, StoreError> {
        let mut got = Vec::new();
        replay(dir, after, |f, p| {
            got.push((f, decode_batch(p).unwrap()));
            Ok(())
        })?;
        Ok(got)
    }

    fn same(a: &WriteBatch, b: &WriteBatch) -> bool {
        a.ops() == b.ops()
    }

    #[test]
    fn batches_round_trip_and_bad_payloads_are_named() {
        for i in 0..20 {
            let b = batch(i);
            assert!(same(&decode_batch(&encode_batch(&b)).unwrap(), &b));
        }
        let bytes = encode_batch(&batch(3));
        let err = decode_batch(&bytes[..bytes.len() - 1]).unwrap_err();
        assert!(err.contains("past the end"), "{err}");
        let mut extra = bytes.clone();
        extra.push(9);
        assert!(decode_batch(&extra).unwrap_err().contains("after the last"));
        let mut bad_tag = bytes;
        bad_tag[4] = 7;
        assert!(decode_batch(&bad_tag)
            .unwrap_err()
            .contains("unknown tag 7"));
    }

    #[test]
    fn synced_frames_read_back_in_order_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), 1).unwrap();
        for i in 1..=6u8 {
            wal.append(i as u64, &encode_batch(&batch(i)));
            if i % 2 == 1 {
                wal.sync().unwrap();
            }
        }
        // Frame 6 is appended but not written: not durable, and not read back.
        assert_eq!(wal.synced(), 5);
        let got = read_all(dir.path(), 0).unwrap();
        assert_eq!(
            got.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5]
        );
        assert!(same(&got[3].1, &batch(4)));
        assert_eq!(
            read_all(dir.path(), 3)
                .unwrap()
                .iter()
                .map(|(f, _)| *f)
                .collect::<Vec<_>>(),
            [4, 5]
        );
    }

    #[test]
    fn a_torn_or_corrupt_tail_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), 1).unwrap();
        for i in 1..=3u8 {
            wal.append(i as u64, &encode_batch(&batch(i)));
        }
        wal.sync().unwrap();
        let (_, path) = segments(dir.path()).unwrap().pop().unwrap();
        let full = fs::read(&path).unwrap();
        let used: usize = (1..=3u8)
            .map(|i| HEADER_BYTES + encode_batch(&batch(i)).len())
            .sum();
        assert_eq!(
            sync_mark_at(&full, used),
            Some(3),
            "the sync's mark after the frames"
        );
        assert!(
            full[used + HEADER_BYTES..].iter().all(|&b| b == 0),
            "zero-filled after it"
        );
        // Torn: the last frame lacks its final byte.
        fs::write(&path, &full[..used - 1]).unwrap();
        assert_eq!(read_all(dir.path(), 0).unwrap().len(), 2);
        // Corrupt: a flipped payload byte in frame 2 fails its checksum. The sync's
        // mark says frame 2 was durable: refused.
        let mut bad = full.clone();
        let second = HEADER_BYTES + encode_batch(&batch(1)).len() + HEADER_BYTES;
        bad[second] ^= 0xff;
        fs::write(&path, &bad).unwrap();
        assert_eq!(read_all(dir.path(), 0).unwrap_err().code(), "XX001");
        // Without the mark (a crash of the machine lost it), nothing says so: the
        // frames from the damage on read as a torn tail.
        bad[used..used + HEADER_BYTES].fill(0);
        fs::write(&path, &bad).unwrap();
        assert_eq!(read_all(dir.path(), 0).unwrap().len(), 1);
    }

    #[test]
    fn segments_are_filled_ahead_in_steps_and_the_frames_survive_each_fill() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), 1).unwrap();
        // Frames of 100 KiB: the sixth passes the space the first one filled.
        let payload = |i: u64| vec![i as u8 + 1; 100 << 10];
        let frame_bytes = (HEADER_BYTES + (100 << 10)) as u64;
        wal.append(1, &payload(1));
        wal.sync().unwrap();
        let (_, path) = segments(dir.path()).unwrap().pop().unwrap();
        let len = || fs::metadata(&path).unwrap().len();
        // Filled up to the step after the one the frames end in, only when they
        // pass the filled space.
        let mut filled = 2 * ZERO_FILL_BYTES;
        assert_eq!(len(), filled, "one step past the first frame");
        for i in 2..=6 {
            wal.append(i, &payload(i));
            wal.sync().unwrap();
            let end = i * frame_bytes;
            if end > filled {
                filled = end.next_multiple_of(ZERO_FILL_BYTES) + ZERO_FILL_BYTES;
            }
            assert_eq!(len(), filled, "after frame {i}");
        }
        assert_eq!(
            filled,
            4 * ZERO_FILL_BYTES,
            "the sixth frame passed the first fill"
        );
        let bytes = fs::read(&path).unwrap();
        let used = (6 * frame_bytes) as usize;
        assert_eq!(sync_mark_at(&bytes, used), Some(6), "the last sync's mark");
        assert!(
            bytes[used + HEADER_BYTES..].iter().all(|&b| b == 0),
            "zeros after it"
        );
        let mut seen = Vec::new();
        replay(dir.path(), 0, |f, p| {
            assert_eq!(p, payload(f).as_slice(), "frame {f}");
            seen.push(f);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, [1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn a_log_that_skips_frames_the_store_lacks_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), 10).unwrap();
        wal.append(10, &encode_batch(&batch(1)));
        wal.sync().unwrap();
        let err = read_all(dir.path(), 5).unwrap_err().to_string();
        assert!(err.contains("frame 10") && err.contains("up to 5"), "{err}");
        assert_eq!(read_all(dir.path(), 9).unwrap().len(), 1);
    }

    /// A frame payload just over half a segment: every second one rolls the log.
    fn half_a_segment() -> Vec<u8> {
        let mut b = WriteBatch::new();
        b.put(b"big".to_vec(), vec![7u8; (SEGMENT_BYTES / 2) as usize + 1]);
        encode_batch(&b)
    }

    /// A log in `dir` of frames 1 to 3, each in a segment of its own.
    fn three_segments(dir: &Path) -> Wal {
        let wal = Wal::new(dir, 1).unwrap();
        let payload = half_a_segment();
        for f in 1..=3 {
            wal.append(f, &payload);
            wal.sync().unwrap();
        }
        wal
    }

    #[test]
    fn released_segments_are_removed_and_the_rest_still_reads() {
        let dir = tempfile::tempdir().unwrap();
        let wal = three_segments(dir.path());
        assert_eq!(segments(dir.path()).unwrap().len(), 3);
        wal.release_through(1).unwrap();
        assert_eq!(segments(dir.path()).unwrap().len(), 2);
        let got = read_all(dir.path(), 1).unwrap();
        assert_eq!(got.iter().map(|(f, _)| *f).collect::<Vec<_>>(), [2, 3]);
        // The open segment is never removed.
        wal.release_through(3).unwrap();
        assert_eq!(segments(dir.path()).unwrap().len(), 1);
    }

    /// A segment that ends early although another follows it was damaged: the frames
    /// after it were acknowledged as durable, so the scan refuses rather than take the
    /// damage for the end of the log and remove them.
    #[test]
    fn a_damaged_segment_before_another_is_refused_and_nothing_removed() {
        let dir = tempfile::tempdir().unwrap();
        drop(three_segments(dir.path()));
        let all = segments(dir.path()).unwrap();
        assert_eq!(all.len(), 3);
        let mut bytes = fs::read(&all[1].1).unwrap();
        bytes[HEADER_BYTES + 100] ^= 0xff;
        fs::write(&all[1].1, &bytes).unwrap();
        let err = read_all(dir.path(), 0).unwrap_err().to_string();
        for part in [
            "damaged write-ahead log",
            "frame 2 at offset 0 of wal-00000000000000000002.log",
            "the sync mark at offset",
        ] {
            assert!(err.contains(part), "{part}: {err}");
        }
        assert_eq!(segments(dir.path()).unwrap().len(), 3, "nothing removed");
        // Whatever the store holds: a segment is never taken for a released one a
        // crash brought back and removed.
        assert!(scan(dir.path(), false, 0, |_, _| Ok(())).is_err());
        // Segments that hold no frame (created just before a crash) are no damage: the
        // log ends in the first, and those after it are stale.
        for (_, path) in &all[1..] {
            fs::write(path, vec![0u8; 4096]).unwrap();
        }
        let found = scan(dir.path(), false, 0, |_, _| Ok(())).unwrap();
        assert_eq!(found.segments.len(), 1);
        assert_eq!(found.stale, [all[1].1.clone(), all[2].1.clone()]);
    }

    /// A frame the log stops at that a later frame's durable mark covers was flushed,
    /// so acknowledged: damage, refused with the file and offset. One no later mark
    /// covers was never flushed: a torn tail, dropped.
    #[test]
    fn damage_to_a_flushed_frame_is_told_from_a_torn_tail_by_the_marks_after_it() {
        // Frames 1 to 4, each flushed before the next; `sealed` as a clean close
        // leaves the log.
        let write = |sealed: bool| {
            let dir = tempfile::tempdir().unwrap();
            let wal = Wal::new(dir.path(), 1).unwrap();
            for i in 1..=4u8 {
                wal.append(i as u64, &encode_batch(&batch(i)));
                wal.sync().unwrap();
            }
            if sealed {
                assert!(wal.seal(5).unwrap());
            }
            drop(wal);
            let (_, path) = segments(dir.path()).unwrap().pop().unwrap();
            (dir, path)
        };
        let (dir, path) = write(false);
        let full = fs::read(&path).unwrap();
        let offset = |frame: u8| -> usize {
            (1..frame)
                .map(|i| HEADER_BYTES + encode_batch(&batch(i)).len())
                .sum()
        };
        for (frame, what) in [(2, "a payload byte"), (2, "the length"), (3, "the number")] {
            let mut bad = full.clone();
            let at = offset(frame)
                + match what {
                    "a payload byte" => HEADER_BYTES + 1,
                    "the length" => 1,
                    _ => 9,
                };
            bad[at] ^= 0x5a;
            fs::write(&path, &bad).unwrap();
            let err = read_all(dir.path(), 0).unwrap_err();
            assert_eq!(err.code(), "XX001", "{err}");
            let text = err.to_string();
            assert!(
                text.contains(&format!("frame {frame} at offset {}", offset(frame)))
                    && text.contains("wal-00000000000000000001.log")
                    && text.contains("hawser duplicate"),
                "{what} of frame {frame}: {text}"
            );
        }
        // The last frame: the sync's mark after it says it was durable.
        let mut bad = full.clone();
        bad[offset(4) + HEADER_BYTES + 1] ^= 0x5a;
        fs::write(&path, &bad).unwrap();
        let err = read_all(dir.path(), 0).unwrap_err().to_string();
        assert!(
            err.contains("frame 4 at offset") && err.contains("the sync mark"),
            "{err}"
        );
        // Without that mark (lost with the machine), a torn write looks the same:
        // dropped.
        let end = offset(5);
        bad[end..end + HEADER_BYTES].fill(0);
        fs::write(&path, &bad).unwrap();
        assert_eq!(read_all(dir.path(), 0).unwrap().len(), 3);
        // A clean close's frame says so too, whatever comes after it.
        let (dir, path) = write(true);
        let sealed = fs::read(&path).unwrap();
        let mut bad = sealed.clone();
        bad[offset(4) + HEADER_BYTES + 1] ^= 0x5a;
        let end = offset(5) + HEADER_BYTES + encode_batch(&WriteBatch::new()).len();
        bad[end..end + HEADER_BYTES].fill(0);
        fs::write(&path, &bad).unwrap();
        let err = read_all(dir.path(), 0).unwrap_err().to_string();
        assert!(err.contains("frame 4 at offset"), "{err}");
        fs::write(&path, &sealed).unwrap();
        assert_eq!(
            read_all(dir.path(), 0).unwrap().len(),
            5,
            "the mark is a frame"
        );
    }

    /// Frames written ahead after a sync overwrite that sync's mark, but carry the
    /// same news: their durable mark is set when they are written, after the sync.
    #[test]
    fn frames_written_after_a_sync_say_what_it_made_durable() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), 1).unwrap();
        // Frame 4 is appended while frames 1 to 3 are not yet durable, and written
        // only after their sync.
        for i in 1..=3u8 {
            wal.append(i as u64, &encode_batch(&batch(i)));
        }
        wal.append(4, &encode_batch(&batch(4)));
        {
            let mut open = wal.open.lock();
            let mut p = wal.pending.lock();
            // Only frames 1 to 3 go into this sync: frame 4 waits in the buffer.
            let cut = p.frames[3].0;
            let rest = p.buf.split_off(cut);
            let mut fourth = p.frames.split_off(3);
            fourth[0].0 -= cut;
            p.last = 3;
            drop(p);
            wal.write_pending(&mut open).unwrap();
            let o = open.as_ref().unwrap();
            o.file.sync_data().unwrap();
            wal.synced.store(3, Ordering::Release);
            let mut p = wal.pending.lock();
            p.buf = rest;
            p.frames = fourth;
            p.first = 4;
            p.last = 4;
        }
        wal.write_ahead().unwrap();
        drop(wal);
        let (_, path) = segments(dir.path()).unwrap().pop().unwrap();
        let mut bytes = fs::read(&path).unwrap();
        let third = (1..3u8)
            .map(|i| HEADER_BYTES + encode_batch(&batch(i)).len())
            .sum::<usize>();
        bytes[third + HEADER_BYTES + 1] ^= 0x5a;
        fs::write(&path, &bytes).unwrap();
        let err = read_all(dir.path(), 0).unwrap_err().to_string();
        assert!(
            err.contains("frame 3 at offset") && err.contains("frame 4 at offset"),
            "{err}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// A log of frames 1..=n cut into segments, each frame flushed before the next
        /// (its mark says so), of which a prefix was released; segments created for the
        /// next frames may follow without any, and what a reused segment held before — a
        /// whole old frame, or the middle of one — may lie behind the frames. Undamaged, every frame of the segments left is read, once,
        /// in order, and only the empty segments are stale. With one byte of one frame
        /// damaged, the scan refuses — unless the frame is the log's last, which nothing
        /// says was flushed: it is dropped.
        #[test]
        fn the_log_reads_whole_or_refuses_named_damage(
            cuts in proptest::collection::btree_set(2u64..40, 0..8),
            n in 1u64..40,
            released_pick in 0usize..8,
            empty_after in 0usize..3,
            reused_tail in 0u8..3,
            damage in proptest::option::of((0u64..40, 0usize..40)),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut firsts: Vec<u64> = std::iter::once(1).chain(cuts.into_iter().filter(|&c| c <= n)).collect();
            firsts.dedup();
            let lasts: Vec<u64> = firsts.iter().skip(1).map(|f| f - 1).chain([n]).collect();
            let released = released_pick % firsts.len();
            let from = firsts[released];
            let damaged = damage.map(|(pick, byte)| (from + pick % (n - from + 1), byte));
            for (&first, &last) in firsts.iter().zip(&lasts).skip(released) {
                let mut bytes = Vec::new();
                for f in first..=last {
                    let at = bytes.len();
                    encode_frame(&mut bytes, f, f - 1, &[f as u8; 40]);
                    if let Some((d, byte)) = damaged {
                        if d == f {
                            bytes[at + HEADER_BYTES + byte] ^= 0x80;
                        }
                    }
                }
                // What a reused segment held before may lie behind its frames: a whole
                // old frame, or (its frames were of other sizes) the middle of one.
                let mut old = Vec::new();
                encode_frame(&mut old, 0, 0, &[9; 40]);
                match reused_tail {
                    1 => bytes.extend_from_slice(&old),
                    2 => bytes.extend_from_slice(&old[HEADER_BYTES + 3..]),
                    _ => {}
                }
                bytes.extend_from_slice(&[0u8; 64]);
                fs::write(dir.path().join(segment_name(first)), &bytes).unwrap();
            }
            for k in 0..empty_after as u64 {
                fs::write(dir.path().join(segment_name(n + 1 + k)), [0u8; 64]).unwrap();
            }
            let mut seen = Vec::new();
            let found = scan(dir.path(), false, 0, |f, p| {
                assert_eq!(p, &[f as u8; 40][..]);
                seen.push(f);
                Ok(())
            });
            match damaged {
                Some((d, _)) if d < n => {
                    let err = found.err().expect("damage before the last frame is refused");
                    proptest::prop_assert_eq!(err.code(), "XX001");
                    // Salvaged: the frames before the damage, and from then on a log
                    // that opens as it is.
                    for salvage in [true, false] {
                        let mut kept = Vec::new();
                        let found = scan(dir.path(), salvage, 0, |f, _| {
                            kept.push(f);
                            Ok(())
                        })
                        .unwrap();
                        proptest::prop_assert_eq!(found.salvaged.is_some(), salvage);
                        proptest::prop_assert_eq!(kept, (from..d).collect::<Vec<_>>());
                    }
                }
                _ => {
                    let found = found.unwrap();
                    let end = if damaged.is_some() { n - 1 } else { n };
                    proptest::prop_assert_eq!(&seen, &(from..=end).collect::<Vec<_>>());
                    // A segment left without a whole frame is stale, as are the empty ones.
                    let live: Vec<u64> = firsts[released..].iter().copied().filter(|&f| f <= end).collect();
                    let log: Vec<u64> = found.segments.iter().map(|s| s.first).collect();
                    proptest::prop_assert_eq!(log, live);
                    let mut stale: Vec<u64> = firsts[released..].iter().copied().filter(|&f| f > end).collect();
                    stale.extend((0..empty_after as u64).map(|k| n + 1 + k));
                    let stale: Vec<PathBuf> = stale.into_iter().map(|f| dir.path().join(segment_name(f))).collect();
                    proptest::prop_assert_eq!(found.stale, stale);
                }
            }
        }
    }

    /// How a test damages a segment's bytes.
    #[derive(Debug, Clone)]
    enum Damage {
        Flip(usize),
        Zero(usize, usize),
        /// Zeros from the start of a frame (picked by index), at least its header.
        ZeroFrame(usize, usize),
        Truncate(usize),
    }

    fn damage() -> impl proptest::strategy::Strategy<Value = Damage> {
        use proptest::prelude::*;
        prop_oneof![
            (0usize..4096).prop_map(Damage::Flip),
            (0usize..4096, 1usize..200).prop_map(|(at, len)| Damage::Zero(at, len)),
            (0usize..20, 0usize..100).prop_map(|(f, extra)| Damage::ZeroFrame(f, extra)),
            (0usize..4096).prop_map(Damage::Truncate),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        /// Frames 1..=n, each flushed before the next (its mark says so), perhaps a
        /// sync mark after the last, and a checkpoint saying frames through `durable`
        /// were durable; then one byte flipped, a range zeroed, or the segment cut,
        /// anywhere. The log is read whole, or refused as damaged (and salvaged to the
        /// frames before the damage), or loses only frames nothing proves were ever
        /// flushed: those from the first damaged one on, when no intact frame or sync
        /// mark after the damage, nor the checkpoint, says it was durable.
        #[test]
        fn damage_anywhere_is_read_around_refused_or_an_unproven_tail(
            sizes in proptest::collection::vec(1usize..60, 1..20),
            sync_mark in proptest::bool::ANY,
            durable_pick in 0usize..25,
            damage in damage(),
        ) {
            let n = sizes.len() as u64;
            let durable = (durable_pick as u64).min(n);
            let mut bytes = Vec::new();
            // Each frame's (start, end) offsets.
            let mut spans = Vec::new();
            for (i, size) in sizes.iter().enumerate() {
                let f = i as u64 + 1;
                let at = bytes.len();
                encode_frame(&mut bytes, f, f - 1, &vec![f as u8; *size]);
                spans.push((at, bytes.len()));
            }
            let mark_at = bytes.len();
            if sync_mark {
                bytes.extend_from_slice(&encode_sync_mark(n));
            }
            bytes.extend_from_slice(&[0u8; 64]);
            let len = bytes.len();
            let original = bytes.clone();
            match damage {
                Damage::Flip(at) => bytes[at % len] ^= 0x5a,
                Damage::Zero(at, l) => {
                    let at = at % len;
                    bytes[at..(at + l).min(len)].fill(0);
                }
                Damage::ZeroFrame(f, extra) => {
                    let at = spans[f % spans.len()].0;
                    bytes[at..(at + HEADER_BYTES + extra).min(len)].fill(0);
                }
                Damage::Truncate(at) => bytes.truncate(at % len),
            }
            let dir = tempfile::tempdir().unwrap();
            fs::write(dir.path().join(segment_name(1)), &bytes).unwrap();
            let intact = |(a, b): (usize, usize)| b <= bytes.len() && bytes[a..b] == original[a..b];
            // The first frame the damage changed, and whether anything intact after it
            // says it was durable.
            let hit = spans.iter().position(|&span| !intact(span));
            let proven_after = hit.is_some_and(|d| {
                spans[d + 1..].iter().any(|&span| intact(span))
                    || (sync_mark && intact((mark_at, mark_at + HEADER_BYTES)))
            });
            let hit = hit.map(|i| i as u64 + 1);
            let mut seen = Vec::new();
            let found = scan(dir.path(), false, durable, |f, p| {
                assert_eq!(p, &vec![f as u8; sizes[f as usize - 1]][..]);
                seen.push(f);
                Ok(())
            });
            match hit {
                Some(d) if proven_after || d <= durable => {
                    let err = found.err().expect("damage to a durable frame is refused");
                    proptest::prop_assert_eq!(err.code(), "XX001");
                    let mut kept = Vec::new();
                    scan(dir.path(), true, durable, |f, _| {
                        kept.push(f);
                        Ok(())
                    })
                    .unwrap();
                    proptest::prop_assert_eq!(kept, (1..d).collect::<Vec<_>>());
                }
                Some(d) => {
                    found.unwrap();
                    proptest::prop_assert_eq!(seen, (1..d).collect::<Vec<_>>());
                }
                None => {
                    found.unwrap();
                    proptest::prop_assert_eq!(seen, (1..=n).collect::<Vec<_>>());
                }
            }
        }
    }

    /// Released segments become the next ones: the file is renamed, not zero-filled
    /// again, and its old frames behind the new ones never read as log.
    #[test]
    fn released_segments_are_reused_without_a_fill_and_their_old_frames_never_read() {
        let dir = tempfile::tempdir().unwrap();
        let recycled = |d: &Path| {
            fs::read_dir(d)
                .unwrap()
                .filter(|e| {
                    let name = e.as_ref().unwrap().file_name();
                    name.to_str().unwrap().starts_with("recycle-")
                })
                .count()
        };
        // Frames of one size, so a reused segment's old frames lie exactly where the
        // next new ones would.
        let mut b = WriteBatch::new();
        b.put(b"mid".to_vec(), vec![3u8; 1 << 20]);
        let payload = encode_batch(&b);
        let wal = Wal::new(dir.path(), 1).unwrap();
        let mut frame = 0;
        let mut write_until = |segments_wanted: usize, wal: &Wal| {
            while segments(dir.path()).unwrap().len() < segments_wanted {
                frame += 1;
                wal.append(frame, &payload);
                wal.sync().unwrap();
            }
            frame
        };
        let third = write_until(3, &wal);
        wal.release_through(third - 1).unwrap();
        assert_eq!(segments(dir.path()).unwrap().len(), 1);
        assert_eq!(recycled(dir.path()), RECYCLE_KEEP);
        let reused_len = wal
            .recycled
            .lock()
            .last()
            .map(|p| fs::metadata(p).unwrap().len())
            .unwrap();
        assert!(reused_len >= SEGMENT_BYTES - (1 << 21));

        // The open segment fills; the next starts in a reused file, two frames long.
        let first = write_until(2, &wal);
        wal.append(first + 1, &payload);
        wal.sync().unwrap();
        assert_eq!(recycled(dir.path()), RECYCLE_KEEP - 1);
        {
            let open = wal.open.lock();
            let o = open.as_ref().unwrap();
            assert_eq!(o.first, first);
            assert_eq!(
                o.zeroed, reused_len,
                "no fill: the file was written already"
            );
        }
        // What a restart reads ends at the new frames: the old ones behind them have
        // lower numbers.
        let got = read_all(dir.path(), third - 1).unwrap();
        let frames: Vec<u64> = got.iter().map(|(f, _)| *f).collect();
        assert_eq!(frames, (third..=first + 1).collect::<Vec<_>>());
        let again = Wal::open(dir.path(), first + 2, Vec::new()).unwrap();
        assert_eq!(
            again.recycled.lock().len(),
            RECYCLE_KEEP - 1,
            "kept across a restart"
        );
    }

    #[test]
    fn frames_written_ahead_read_back_and_become_durable_at_the_next_sync_or_roll() {
        let dir = tempfile::tempdir().unwrap();
        let wal = Wal::new(dir.path(), 1).unwrap();
        wal.append(1, &encode_batch(&batch(1)));
        wal.sync().unwrap();
        wal.append(2, &encode_batch(&batch(2)));
        wal.write_ahead().unwrap();
        // Written, readable, not durable.
        assert_eq!((wal.written(), wal.synced()), (2, 1));
        assert!(same(
            &decode_batch(&wal.read_frame(2).unwrap().unwrap()).unwrap(),
            &batch(2)
        ));
        // A sync with nothing appended since still syncs what was written ahead.
        wal.sync().unwrap();
        assert_eq!((wal.written(), wal.synced()), (2, 2));

        // A roll to a new segment makes the old segment's written frames durable
        // before frames go to the new one (a sync covers only its own file).
        let payload = half_a_segment();
        wal.append(3, &payload);
        wal.write_ahead().unwrap();
        assert_eq!((wal.written(), wal.synced()), (3, 2));
        wal.append(4, &payload);
        wal.write_ahead().unwrap();
        assert_eq!(segments(dir.path()).unwrap().len(), 2);
        assert_eq!((wal.written(), wal.synced()), (4, 3));
        wal.sync().unwrap();
        assert_eq!(wal.synced(), 4);
        let got = read_all(dir.path(), 0).unwrap();
        assert_eq!(
            got.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            [1, 2, 3, 4]
        );
    }
}
