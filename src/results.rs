//! The results CSV (README, "Results CSV"): one row per cell per round, columns in a fixed order, header
//! always written, missing measurements empty (never 0), and the cell's latency histogram as
//! base64 HdrHistogram V2-deflate so rows from many rounds or hosts merge exactly.

use std::fs::OpenOptions;
use std::io;
use std::path::Path;

use base64::Engine;
use hdrhistogram::serialization::{Deserializer, Serializer, V2DeflateSerializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// The columns, in order. [`Row`]'s fields are declared in this order; a test keeps them equal.
pub(crate) const COLUMNS: [&str; 41] = [
    "run_id",
    "started_at",
    "host",
    "round",
    "profile",
    "flavour",
    "mode",
    "workload",
    "payload_bytes",
    "concurrency",
    "calls",
    "ok",
    "failed",
    "err_connect",
    "err_timeout",
    "err_reset",
    "err_protocol",
    "err_other",
    "elapsed_ms",
    "throughput_rps",
    "lat_min_us",
    "lat_mean_us",
    "lat_p50_us",
    "lat_p90_us",
    "lat_p99_us",
    "lat_p999_us",
    "lat_max_us",
    "conns_opened",
    "req_bytes",
    "resp_bytes",
    "bytes_up",
    "bytes_down",
    "stalls_up",
    "stalls_down",
    "server_cpu_ms",
    "server_rss_kb",
    "seed",
    "hdr",
    "engine",
    "nodelay",
    "write_pattern",
];

/// Columns added since the first files, newest last: a file may lack a tail of them.
const ADDED: usize = 3;

/// One cell, one round.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// Identifies the run (all rows of one `faultrig run` or one `faultrig bench`).
    pub run_id: String,
    /// RFC 3339, UTC, when the round started.
    pub started_at: String,
    /// The load host that measured the row.
    pub host: String,
    pub round: u32,
    /// Empty when unknown (a bench against a target it did not set up).
    pub profile: Option<String>,
    pub flavour: String,
    pub mode: String,
    pub workload: String,
    /// Protobuf size of one request's payload.
    pub payload_bytes: u64,
    pub concurrency: u32,
    pub calls: u64,
    pub ok: u64,
    pub failed: u64,
    pub err_connect: u64,
    pub err_timeout: u64,
    pub err_reset: u64,
    pub err_protocol: u64,
    pub err_other: u64,
    pub elapsed_ms: u64,
    pub throughput_rps: f64,
    /// Latency of successful calls; empty when no call succeeded.
    pub lat_min_us: Option<u64>,
    pub lat_mean_us: Option<u64>,
    pub lat_p50_us: Option<u64>,
    pub lat_p90_us: Option<u64>,
    pub lat_p99_us: Option<u64>,
    pub lat_p999_us: Option<u64>,
    pub lat_max_us: Option<u64>,
    pub conns_opened: u64,
    /// Client bytes on the wire per call, all framing (and per-call handshakes) included.
    pub req_bytes: Option<u64>,
    pub resp_bytes: Option<u64>,
    /// Filled by the runner from its proxy; empty from a bare bench.
    pub bytes_up: Option<u64>,
    pub bytes_down: Option<u64>,
    pub stalls_up: Option<u64>,
    pub stalls_down: Option<u64>,
    /// Filled by the runner from /proc of its server process.
    pub server_cpu_ms: Option<u64>,
    pub server_rss_kb: Option<u64>,
    pub seed: u64,
    /// Base64 HdrHistogram V2-deflate of successful-call latencies in µs.
    pub hdr: String,
    /// How the network was emulated (`model`, `kernel`, `link`); empty from a bare bench, and
    /// in files written before the column existed (they were all `model`).
    #[serde(default)]
    pub engine: Option<String>,
    /// TCP_NODELAY on the client's (and the runner's servers') sockets; empty in files written
    /// before the column existed (they all had it on).
    #[serde(default)]
    pub nodelay: Option<bool>,
    /// `one` or `split` ([`crate::flavour::WritePattern`]); empty in older files (`one`).
    #[serde(default)]
    pub write_pattern: Option<String>,
}

impl Row {
    /// Fills the latency columns and `hdr` from a histogram (µs).
    pub fn set_latency(&mut self, h: &Histogram<u64>) {
        if h.is_empty() {
            for col in [
                &mut self.lat_min_us,
                &mut self.lat_mean_us,
                &mut self.lat_p50_us,
                &mut self.lat_p90_us,
                &mut self.lat_p99_us,
                &mut self.lat_p999_us,
                &mut self.lat_max_us,
            ] {
                *col = None;
            }
        } else {
            self.lat_min_us = Some(h.min());
            self.lat_mean_us = Some(h.mean().round() as u64);
            self.lat_p50_us = Some(h.value_at_quantile(0.5));
            self.lat_p90_us = Some(h.value_at_quantile(0.9));
            self.lat_p99_us = Some(h.value_at_quantile(0.99));
            self.lat_p999_us = Some(h.value_at_quantile(0.999));
            self.lat_max_us = Some(h.max());
        }
        self.hdr = encode_histogram(h);
    }

    /// The row's histogram.
    pub fn histogram(&self) -> Result<Histogram<u64>, HdrError> {
        decode_histogram(&self.hdr)
    }
}

/// A latency histogram in µs: 1 µs to 1 hour, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

pub(crate) fn encode_histogram(h: &Histogram<u64>) -> String {
    let mut bytes = Vec::new();
    V2DeflateSerializer::new()
        .serialize(h, &mut bytes)
        .expect("serialising to memory cannot fail");
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// HdrHistogram's serial format (V2), as hdrhistogram writes it: a cookie, then (deflated or
/// not) a header and the counts.
const HDR_V2: u32 = 0x1c84_9303 | 0x10;
const HDR_V2_DEFLATE: u32 = 0x1c84_9304 | 0x10;
/// Largest `hdr` a results file may hold, by its header: 3 significant digits (ours), values up
/// to 2⁴² µs (50 days; ours stop at an hour), and counts of at most 1 MiB encoded. The
/// deserializer takes a header's sizes at their word (a 40-byte field could claim a 4 GiB
/// payload, or 5 digits up to 2⁶⁴, about 50 MiB of counts), so they are checked first.
const HDR_MAX_DIGITS: u32 = 3;
const HDR_MAX_VALUE: u64 = 1 << 42;
const HDR_MAX_PAYLOAD: u32 = 1 << 20;
/// Counts a histogram within those bounds has, at most.
pub const HDR_MAX_COUNTS: usize = 2048 * 33;

pub(crate) fn decode_histogram(text: &str) -> Result<Histogram<u64>, HdrError> {
    use std::io::Read;
    let bytes = base64::engine::general_purpose::STANDARD.decode(text.trim())?;
    let word = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    // The uncompressed stream: a V2 cookie, then header and counts.
    let mut stream: Box<dyn Read + '_> = match word(&bytes, 0) {
        Some(HDR_V2) => Box::new(bytes.as_slice()),
        Some(HDR_V2_DEFLATE) => {
            let len = word(&bytes, 4).ok_or(HdrError::Malformed("truncated"))? as usize;
            let deflated = &bytes[8..];
            Box::new(flate2::read::ZlibDecoder::new(
                &deflated[..len.min(deflated.len())],
            ))
        }
        _ => return Err(HdrError::Malformed("unknown cookie")),
    };
    // cookie, payload length, normalizing offset, digits, lowest, highest, ratio
    let mut header = [0u8; 40];
    stream.read_exact(&mut header).map_err(HdrError::Header)?;
    let u64_at = |at: usize| u64::from_be_bytes(header[at..at + 8].try_into().expect("8 bytes"));
    let (cookie, payload, digits) = (
        word(&header, 0).unwrap_or(0),
        word(&header, 4).unwrap_or(0),
        word(&header, 12).unwrap_or(0),
    );
    if cookie != HDR_V2 {
        return Err(HdrError::Malformed("unknown inner cookie"));
    }
    if payload > HDR_MAX_PAYLOAD || digits > HDR_MAX_DIGITS || u64_at(24) > HDR_MAX_VALUE {
        return Err(HdrError::TooLarge {
            payload,
            digits,
            highest: u64_at(24),
        });
    }
    let mut rest = std::io::Cursor::new(header).chain(stream);
    Deserializer::new()
        .deserialize(&mut rest)
        .map_err(HdrError::Counts)
}

/// Why a row's `hdr` column is not a latency histogram faultrig can use.
#[derive(Debug, thiserror::Error)]
pub enum HdrError {
    #[error("hdr is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    #[error("hdr is not an HdrHistogram: {0}")]
    Malformed(&'static str),
    #[error("hdr is not an HdrHistogram: header: {0}")]
    Header(io::Error),
    #[error(
        "hdr is not an HdrHistogram: larger than faultrig writes ({payload} bytes of counts, \
         {digits} digits, values up to {highest})"
    )]
    TooLarge {
        payload: u32,
        digits: u32,
        highest: u64,
    },
    #[error("hdr is not an HdrHistogram: {0:?}")]
    Counts(hdrhistogram::serialization::DeserializeError),
    /// Two rows' histograms with bounds that cannot be merged.
    #[error("cannot merge histograms: {0:?}")]
    Merge(hdrhistogram::errors::AdditionError),
}

/// Appends rows to a CSV file, writing the header first when the file is new or empty. Each row
/// is flushed as soon as it is written, so an interrupted run keeps every finished row.
pub struct ResultsWriter {
    writer: csv::Writer<std::fs::File>,
}

impl ResultsWriter {
    pub fn append(path: &Path) -> io::Result<ResultsWriter> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let empty = file.metadata()?.len() == 0;
        let mut writer = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(file);
        if empty {
            writer.write_record(COLUMNS)?;
            writer.flush()?;
        }
        Ok(ResultsWriter { writer })
    }

    pub fn write(&mut self, row: &Row) -> io::Result<()> {
        self.writer.serialize(row).map_err(io::Error::other)?;
        self.writer.flush()
    }
}

/// Why a results CSV could not be read. Each message starts with the file (or what `origin`
/// names), the cause said after it in the same line.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {error}", path.display())]
    Open {
        path: std::path::PathBuf,
        error: io::Error,
    },
    #[error("{origin}: {error}")]
    Header { origin: String, error: csv::Error },
    #[error(
        "{origin}: not a faultrig results file (its header differs from the expected columns)"
    )]
    NotOurs { origin: String },
    /// `row` counts as a text editor does: the header is row 1.
    #[error("{origin}: row {row}: {error}")]
    Row {
        origin: String,
        row: usize,
        error: csv::Error,
    },
}

/// Reads every row of a results CSV, checking its header is ours.
pub fn read(path: &Path) -> Result<Vec<Row>, ReadError> {
    let file = std::fs::File::open(path).map_err(|error| ReadError::Open {
        path: path.to_path_buf(),
        error,
    })?;
    read_from(file, &path.display().to_string())
}

/// [`read`] from any reader; `origin` names it in messages.
pub(crate) fn read_from(input: impl io::Read, origin: &str) -> Result<Vec<Row>, ReadError> {
    let mut reader = csv::Reader::from_reader(input);
    let header = reader
        .headers()
        .map_err(|error| ReadError::Header {
            origin: origin.to_string(),
            error,
        })?
        .clone();
    // Files from before the newer columns have every other column, in the same order.
    let known = (0..=ADDED).any(|missing| {
        header
            .iter()
            .eq(COLUMNS[..COLUMNS.len() - missing].iter().copied())
    });
    if !known {
        return Err(ReadError::NotOurs {
            origin: origin.to_string(),
        });
    }
    reader
        .deserialize()
        .enumerate()
        .map(|(i, row)| {
            row.map_err(|error| ReadError::Row {
                origin: origin.to_string(),
                row: i + 2,
                error,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_from_before_the_newer_columns_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.csv");
        let mut row = Row {
            flavour: "grpc".into(),
            hdr: encode_histogram(&new_histogram()),
            ..Row::default()
        };
        let mut text = Vec::new();
        {
            let mut w = csv::Writer::from_writer(&mut text);
            w.serialize(&row).unwrap();
        }
        // Drop the three newest columns from the header and the row.
        let old: String = String::from_utf8(text)
            .unwrap()
            .lines()
            .map(|l| {
                let mut l = l;
                for _ in 0..ADDED {
                    l = &l[..l.rfind(',').unwrap()];
                }
                format!("{l}\n")
            })
            .collect();
        std::fs::write(&path, old).unwrap();
        let rows = read(&path).unwrap();
        row.engine = None;
        row.nodelay = None;
        row.write_pattern = None;
        assert_eq!(rows, vec![row]);
    }

    #[test]
    fn row_fields_are_the_columns_in_order() {
        let mut out = Vec::new();
        {
            let mut w = csv::Writer::from_writer(&mut out);
            w.serialize(Row::default()).unwrap();
        }
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().next().unwrap(), COLUMNS.join(","));
    }

    #[test]
    fn missing_values_are_empty_and_histograms_round_trip() {
        let mut h = new_histogram();
        for v in [100, 200, 300, 10_000] {
            h.record(v).unwrap();
        }
        let mut row = Row {
            flavour: "grpc".into(),
            ..Row::default()
        };
        row.set_latency(&h);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.csv");
        let mut w = ResultsWriter::append(&path).unwrap();
        w.write(&row).unwrap();
        drop(w);
        let mut w = ResultsWriter::append(&path).unwrap();
        w.write(&row).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3, "one header, two rows");
        // Every measurement the row lacks is an empty field, never 0.
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let record = reader.records().next().unwrap().unwrap();
        for column in [
            "profile",
            "req_bytes",
            "resp_bytes",
            "bytes_up",
            "bytes_down",
            "stalls_up",
            "stalls_down",
            "server_cpu_ms",
            "server_rss_kb",
        ] {
            let at = COLUMNS.iter().position(|c| *c == column).unwrap();
            assert_eq!(&record[at], "", "{column}: empty, not 0");
        }
        let rows = read(&path).unwrap();
        assert_eq!(rows[0], row);
        let mut merged = rows[0].histogram().unwrap();
        merged.add(rows[1].histogram().unwrap()).unwrap();
        assert_eq!(merged.len(), 8);
        assert_eq!(merged.max(), h.max());
    }
}
