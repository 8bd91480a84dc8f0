"""Corpus files read as batches of documents, streaming: text (documents split on blank lines),
JSONL (one document per line) and Parquet (one per row), each optionally gzipped (not Parquet).
scripts/prepare_data.py tokenizes what these readers yield."""
import gzip
import io
import json
import zlib
from pathlib import Path

READ_BYTES = 1 << 20  # input read per batch of documents: what one tokenizer task takes
FORMATS = {".txt": "text", ".jsonl": "jsonl", ".parquet": "parquet"}
DOC_SEPARATOR = "\n\n"


class PrepareError(Exception):
    """Bad input: the message says what is wrong."""


# What reading a damaged file raises: a cut gzip stream ends early (EOFError), a damaged one fails its
# header, its deflate data or its CRC (BadGzipFile is an OSError, zlib.error); a disk fails with OSError.
READ_ERRORS = (EOFError, OSError, zlib.error)


def one_line(e):
    """An exception as one line of text (pyarrow's messages span several, with control bytes)."""
    text = "".join(c if c.isprintable() else " " for c in str(e))
    return f"{type(e).__name__}: {' '.join(text.split())}"


def read_error(path, where, e):
    what = "the gzip data is truncated or corrupt" if path.name.endswith(".gz") else "reading failed"
    return PrepareError(f"{path}: {what} {where} ({one_line(e)})")


def input_format(path, given="auto"):
    """text, jsonl or parquet: given, or from the file name (a .gz suffix is looked through); a file of
    any other name is text."""
    if given != "auto":
        return given
    name = path.name[:-3] if path.name.endswith(".gz") else path.name
    return FORMATS.get(Path(name).suffix, "text")


def input_files(inputs, given="auto"):
    """[(path, format)] of the inputs in order; a folder gives its corpus files, sorted, recursively."""
    out = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.is_file() and
                           (q.name[:-3] if q.name.endswith(".gz") else q.name).endswith(tuple(FORMATS)))
            if not found:
                raise PrepareError(f"{p}: no {', '.join('*' + e for e in FORMATS)} files in this folder")
            out += [(q, input_format(q, given)) for q in found]
        elif p.is_file():
            out.append((p, input_format(p, given)))
        else:
            raise PrepareError(f"input: no such file or folder: {item}")
    return out


class InputFile:
    """A corpus file opened for reading (through gzip for *.gz); `consumed()` is how many of the file's
    own bytes were read since the last call, for the progress bar."""

    def __init__(self, path):
        self.raw = open(path, "rb")
        self.stream = gzip.GzipFile(fileobj=self.raw) if path.name.endswith(".gz") else self.raw
        self.seen = 0

    def consumed(self):
        now = self.raw.tell()
        n, self.seen = now - self.seen, now
        return n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.close()
        self.raw.close()


def readable_lines(path):
    """How many lines of a file read and decode before it fails: where a damaged file breaks off (the
    megabyte reads of read_text do not say)."""
    n = 0
    try:
        with InputFile(path) as f:
            for raw in f.stream:
                raw.decode("utf-8")
                n += 1
    except (UnicodeDecodeError, *READ_ERRORS):
        pass
    return n


def read_text(path):
    """Yield (documents, bytes read) of a text file: documents split on "\n\n", each with it restored."""
    rest = ""
    try:
        with InputFile(path) as f:
            text = io.TextIOWrapper(f.stream, encoding="utf-8")  # universal newlines, as open() reads
            while True:
                chunk = text.read(READ_BYTES)
                parts = (rest + chunk).split(DOC_SEPARATOR)
                rest = parts.pop()  # may continue in the next chunk
                if not chunk:
                    yield [d + DOC_SEPARATOR for d in parts + [rest]], f.consumed()
                    return
                yield [d + DOC_SEPARATOR for d in parts], f.consumed()
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: line {readable_lines(path) + 1} is not UTF-8 text ({e})") from e
    except READ_ERRORS as e:
        raise read_error(path, f"at line {readable_lines(path) + 1}", e) from e


def json_line(line, path, lineno):
    """The JSON value of one JSONL line (None for a blank line); a bad line is named by file and number."""
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except ValueError as e:
        raise PrepareError(f"{path}:{lineno}: not JSON ({e})") from e


def _lines(stream, path):
    """(number, line) of a binary stream; a damaged file is named with its last whole line."""
    lineno = 0
    it = iter(stream)
    while True:
        try:
            line = next(it)
        except StopIteration:
            return
        except READ_ERRORS as e:
            raise read_error(path, f"at line {lineno + 1}", e) from e
        lineno += 1
        yield lineno, line


def read_jsonl(path, field):
    """Yield (documents, bytes read) of a JSONL file: the `field` of every line."""
    docs, size, lineno = [], 0, 0
    with InputFile(path) as f:
        for lineno, line in _lines(f.stream, path):
            size += len(line)
            record = json_line(line, path, lineno)
            if record is None:
                continue
            text = record.get(field) if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise PrepareError(f"{path}:{lineno}: no text field {field!r} (use --text-field)")
            docs.append(text)
            if size >= READ_BYTES:
                yield docs, f.consumed()
                docs, size = [], 0
        yield docs, f.consumed()


def parquet_file(path, field):
    """The opened Parquet file, its `field` column checked to hold text (from the schema alone)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise PrepareError("reading Parquet needs pyarrow: pip install pyarrow") from e
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and OSError subclasses
        raise PrepareError(f"{path}: not a Parquet file ({one_line(e)})") from e
    names = pf.schema_arrow.names
    if field not in names:
        raise PrepareError(f"{path}: no column {field!r} (columns: {', '.join(names)}; use --text-field)")
    kind = pf.schema_arrow.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or
            getattr(pa.types, "is_string_view", lambda _: False)(kind)):
        raise PrepareError(f"{path}: column {field!r} holds {kind}, not text (strings); use --text-field to name "
                           f"the text column (columns: {', '.join(names)})")
    return pf


def check_inputs(files, field):
    """What can be checked before any tokenizing: every Parquet file opens and has a text column `field`."""
    for path, fmt in files:
        if fmt == "parquet":
            parquet_file(path, field)


def read_parquet(path, field):
    """Yield (documents, a share of the file's bytes) of a Parquet file: column `field`, in batches; a row
    group that cannot be read is named with its rows."""
    pf = parquet_file(path, field)
    rows, size = max(pf.metadata.num_rows, 1), path.stat().st_size
    first = 0  # the row group's first row
    for group in range(pf.num_row_groups):
        n = pf.metadata.row_group(group).num_rows
        row = first
        try:
            for batch in pf.iter_batches(batch_size=1024, row_groups=[group], columns=[field]):
                docs = [t for t in batch.column(0).to_pylist() if t is not None]
                yield docs, size * batch.num_rows // rows
                row += batch.num_rows
        except Exception as e:  # pyarrow raises OSError, ArrowInvalid, ArrowException subclasses
            raise PrepareError(f"{path}: row group {group} (rows {first}-{first + n - 1}) cannot be read at row "
                               f"{row} ({one_line(e)})") from e
        first += n


def read_batches(path, fmt, field):
    if fmt == "text":
        return read_text(path)
    if fmt == "jsonl":
        return read_jsonl(path, field)
    return read_parquet(path, field)
