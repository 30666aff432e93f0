//! A reader between a layer's decompressor and the tar parser that bounds what the parser
//! would otherwise take on trust: the stream's total size (a decompression bomb), and the
//! size of metadata entries (pax headers, GNU long names), which the parser reads whole into
//! memory. It follows the tar framing itself: a 512-byte header, its data padded to 512.

use std::io::{self, Read};

const BLOCK: u64 = 512;
/// Largest pax header or long name accepted (real ones are a few hundred bytes).
pub const MAX_METADATA_ENTRY: u64 = 1 << 20;
/// Entry types whose data the tar parser reads whole into memory.
const METADATA_TYPES: &[u8] = b"xgLK";

/// Wraps a tar stream; fails reads once `limit` bytes have passed or when a metadata entry
/// is larger than [`MAX_METADATA_ENTRY`].
pub struct TarGuard<R> {
    inner: R,
    /// Bytes passed so far.
    pos: u64,
    /// Where the next header starts.
    next_header: u64,
    header: [u8; BLOCK as usize],
    limit: u64,
    /// Within a pax header's entry: its data so far (at most [`MAX_METADATA_ENTRY`]), read
    /// when the next header comes.
    pax: Option<Vec<u8>>,
}

impl<R: Read> TarGuard<R> {
    pub fn new(inner: R, limit: u64) -> Self {
        TarGuard { inner, pos: 0, next_header: 0, header: [0; BLOCK as usize], limit, pax: None }
    }

    /// Bytes passed so far.
    pub fn passed(&self) -> u64 {
        self.pos
    }

    pub fn into_inner(self) -> R {
        self.inner
    }

    /// Looks at `bytes`, which start at stream offset `self.pos`.
    fn inspect(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            let in_header = self.pos >= self.next_header && self.pos < self.next_header + BLOCK;
            if !in_header {
                // Data: skip to the next header (or the end of what we have).
                let skip = (self.next_header.max(self.pos) - self.pos).min(bytes.len() as u64);
                let skip = if skip == 0 { bytes.len() as u64 } else { skip };
                self.scan_pax(&bytes[..skip as usize])?;
                self.advance(&mut bytes, skip);
                continue;
            }
            let at = (self.pos - self.next_header) as usize;
            let take = (BLOCK as usize - at).min(bytes.len());
            self.header[at..at + take].copy_from_slice(&bytes[..take]);
            self.advance(&mut bytes, take as u64);
            if at + take == BLOCK as usize {
                self.header_done()?;
            }
        }
        Ok(())
    }

    /// Keeps `data`, part of a pax header's entry.
    fn scan_pax(&mut self, data: &[u8]) -> io::Result<()> {
        if let Some(pax) = self.pax.as_mut() {
            pax.extend_from_slice(data);
        }
        Ok(())
    }

    fn advance(&mut self, bytes: &mut &[u8], n: u64) {
        *bytes = &bytes[n as usize..];
        self.pos += n;
    }

    /// A whole header has been seen: check it and find the next one.
    fn header_done(&mut self) -> io::Result<()> {
        if let Some(pax) = self.pax.take() {
            refuse_size_records(&pax)?;
        }
        let size = entry_size(&self.header)?;
        let kind = self.header[156];
        // The data of a pax header (`x`, or `g` for every entry after it) is read whole
        // (it is bounded below) before the parser sees the header it applies to.
        self.pax = matches!(kind, b'x' | b'g').then(Vec::new);
        if METADATA_TYPES.contains(&kind) && size > MAX_METADATA_ENTRY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a tar metadata entry ({}) of {size} bytes, above {MAX_METADATA_ENTRY}", kind as char),
            ));
        }
        let padded = size.div_ceil(BLOCK).saturating_mul(BLOCK);
        self.next_header = self.next_header.saturating_add(BLOCK).saturating_add(padded);
        Ok(())
    }
}

/// Refuses a pax `size` record among `data`'s records (`LEN KEYWORD=VALUE\n` each): it
/// overrides the next entry's size, so the guard would look for the next header elsewhere
/// than the parser does (tar writes one only for files of 8 GiB and more).
fn refuse_size_records(data: &[u8]) -> io::Result<()> {
    let mut rest = data;
    while let Some(space) = rest.iter().position(|b| *b == b' ') {
        let Some(len) = std::str::from_utf8(&rest[..space]).ok().and_then(|l| l.parse::<usize>().ok()) else { break };
        let Some(record) = rest.get(space + 1..len) else { break };
        if record.starts_with(b"size=") {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a tar pax header overrides an entry's size"));
        }
        rest = &rest[len..];
    }
    Ok(())
}

/// The size of a tar header's entry, read as the tar parser reads it (so both find the next
/// header in the same place). An all-zero block (end of archive) has size 0.
fn entry_size(header: &[u8; BLOCK as usize]) -> io::Result<u64> {
    if header.iter().all(|b| *b == 0) {
        return Ok(0);
    }
    tar::Header::from_byte_slice(header).entry_size()
}

impl<R: Read> Read for TarGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if self.pos + n as u64 > self.limit {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("the uncompressed layers exceed {} bytes", self.limit),
            ));
        }
        self.inspect(&buf[..n])?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_with(kind: tar::EntryType, size: usize) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(kind);
        header.set_size(size as u64);
        header.set_mode(0o644);
        builder.append_data(&mut header, "f", &vec![0u8; size][..]).unwrap();
        let mut header = tar::Header::new_ustar();
        header.set_size(3);
        builder.append_data(&mut header, "g", &b"abc"[..]).unwrap();
        builder.into_inner().unwrap()
    }

    fn read_all(bytes: &[u8], limit: u64, chunk: usize) -> io::Result<u64> {
        let mut guard = TarGuard::new(bytes, limit);
        let mut buf = vec![0u8; chunk];
        while guard.read(&mut buf)? > 0 {}
        Ok(guard.passed())
    }

    #[test]
    fn passes_ordinary_tars_and_bounds_metadata_and_size() {
        let ok = tar_with(tar::EntryType::Regular, 3 << 20);
        for chunk in [1, 7, 512, 4096, 1 << 20] {
            assert_eq!(read_all(&ok, u64::MAX, chunk).unwrap(), ok.len() as u64, "chunk {chunk}");
        }
        let big_pax = tar_with(tar::EntryType::XHeader, (MAX_METADATA_ENTRY + 1) as usize);
        let error = read_all(&big_pax, u64::MAX, 4096).unwrap_err();
        assert!(error.to_string().contains("metadata entry"), "{error}");
        let error = read_all(&ok, 1 << 20, 4096).unwrap_err();
        assert!(error.to_string().contains("exceed"), "{error}");
        // The tar parser still reads what passed the guard.
        let mut archive = tar::Archive::new(TarGuard::new(&ok[..], u64::MAX));
        assert_eq!(archive.entries().unwrap().count(), 2);
    }

    /// What the parser would read into memory is judged by the size the parser reads: a size
    /// field it trims, or a pax record that overrides it, gets no past the guard.
    #[test]
    fn sizes_are_read_as_the_parser_reads_them() {
        let mut long_name = tar_with(tar::EntryType::GNULongName, 4);
        // "\t" then octal digits: the parser trims it to 8 GiB - 1.
        long_name[124..136].copy_from_slice(b"\t7777777777\0");
        let mut fixed = tar::Header::new_old();
        fixed.as_mut_bytes().copy_from_slice(&long_name[..512]);
        fixed.set_cksum();
        long_name[..512].copy_from_slice(fixed.as_bytes());
        let error = read_all(&long_name, u64::MAX, 4096).unwrap_err();
        assert!(error.to_string().contains("metadata entry"), "{error}");

        let mut builder = tar::Builder::new(Vec::new());
        builder.append_pax_extensions([("size", &b"4"[..])]).unwrap();
        let mut header = tar::Header::new_ustar();
        header.set_size(0);
        builder.append_data(&mut header, "f", &b""[..]).unwrap();
        let overridden = builder.into_inner().unwrap();
        for chunk in [1, 100, 4096] {
            let error = read_all(&overridden, u64::MAX, chunk).unwrap_err();
            assert!(error.to_string().contains("overrides"), "chunk {chunk}: {error}");
        }
        // Pax records of other kinds (Python's tarfile writes `mtime`) pass, whatever their
        // values say.
        let mut builder = tar::Builder::new(Vec::new());
        builder.append_pax_extensions([("mtime", &b"1.5"[..]), ("SCHILY.xattr.user.a", &b"x size=9"[..])]).unwrap();
        let mut header = tar::Header::new_ustar();
        header.set_size(1);
        builder.append_data(&mut header, "f", &b"x"[..]).unwrap();
        let plain = builder.into_inner().unwrap();
        assert_eq!(read_all(&plain, u64::MAX, 7).unwrap(), plain.len() as u64);
    }
}
