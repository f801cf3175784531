#include "core/tensor/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/status_macros.h"

namespace attnserve {
namespace {

// absl (20220623) has its own string_view type, which StrCat wants.
absl::string_view Name(DType dtype) {
  const std::string_view name = DTypeName(dtype);
  return absl::string_view(name.data(), name.size());
}

// The format is specified in numpy's numpy/lib/format.py (NEP 1): a 6-byte magic, a major and a
// minor version byte, a little-endian header length (2 bytes in 1.0, 4 bytes in 2.0 and 3.0),
// then the header: a Python dict literal padded with spaces and ending in '\n' so that the data
// starts on a 64-byte boundary.
constexpr std::string_view kMagic("\x93NUMPY", 6);
constexpr size_t kArrayAlign = 64;
// numpy pads the header with room for the first dim to grow to this many digits, so that it can
// rewrite the shape in place; we copy the habit so that our files are byte-identical to np.save.
constexpr size_t kGrowthAxisMaxDigits = 21;

// What the header says about the data that follows it.
struct NpyLayout {
  std::string descr;
  DType dtype = DType::kF32;
  std::vector<int64_t> dims;
  size_t data_offset = 0;  // bytes from the start of the file to the first element
};

absl::Status Invalid(absl::string_view name, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(name, ": ", what));
}

// Reads the magic, version and header length. `head` is the start of the file (at least the
// first 12 bytes, or all of it if shorter). Returns the offset where the data starts.
absl::StatusOr<size_t> ParsePreamble(std::string_view head, absl::string_view name,
                                     size_t* header_start) {
  if (head.size() < kMagic.size() + 2 || head.substr(0, kMagic.size()) != kMagic) {
    return Invalid(name, "not a .npy file (missing the \\x93NUMPY magic)");
  }
  const uint8_t major = static_cast<uint8_t>(head[6]);
  const uint8_t minor = static_cast<uint8_t>(head[7]);
  size_t len_bytes = 0;
  if (major == 1) {
    len_bytes = 2;
  } else if (major == 2 || major == 3) {
    len_bytes = 4;  // 3.0 differs from 2.0 only in allowing utf-8 in the header
  } else {
    return Invalid(name, absl::StrCat(".npy format version ", major, ".", minor,
                                      " is not supported (want 1.0, 2.0 or 3.0)"));
  }
  if (head.size() < 8 + len_bytes) {
    return Invalid(name, "truncated .npy preamble (header length missing)");
  }
  size_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i) {
    header_len |= static_cast<size_t>(static_cast<uint8_t>(head[8 + i])) << (8 * i);
  }
  *header_start = 8 + len_bytes;
  return *header_start + header_len;
}

// A recursive-descent reader for the one Python literal numpy writes: a dict whose keys are
// strings and whose values are strings, True/False or tuples of ints. numpy itself evaluates it
// with ast.literal_eval, so any spacing, quote style and trailing commas are legal.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, absl::string_view name) : text_(text), name_(name) {}

  absl::Status Parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{' to open the header dict");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      ATTN_ASSIGN_OR_RETURN(std::string key, ParseString());
      SkipSpace();
      if (!Consume(':')) return Error(absl::StrCat("expected ':' after key '", key, "'"));
      SkipSpace();
      if (key == "descr") {
        if (have_descr) return Error("duplicate key 'descr'");
        have_descr = true;
        if (Peek() == '[') {
          return Invalid(name_, "descr: structured (record) dtypes are not supported");
        }
        ATTN_ASSIGN_OR_RETURN(*descr, ParseString());
      } else if (key == "fortran_order") {
        if (have_fortran) return Error("duplicate key 'fortran_order'");
        have_fortran = true;
        ATTN_ASSIGN_OR_RETURN(*fortran_order, ParseBool());
      } else if (key == "shape") {
        if (have_shape) return Error("duplicate key 'shape'");
        have_shape = true;
        ATTN_ASSIGN_OR_RETURN(*shape, ParseShape());
      } else {
        // numpy rejects unknown keys as well: they would mean a format we do not understand.
        return Error(absl::StrCat("unexpected key '", key,
                                  "' (a header has exactly descr, fortran_order and shape)"));
      }
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume('}')) break;
      return Error("expected ',' or '}' after a value");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after the header dict");
    if (!have_descr) return Error("missing key 'descr'");
    if (!have_fortran) return Error("missing key 'fortran_order'");
    if (!have_shape) return Error("missing key 'shape'");
    return absl::OkStatus();
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return Invalid(name_, absl::StrCat("malformed .npy header at offset ", pos_, ": ", what));
  }

  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }

  bool Consume(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) return false;
    ++pos_;
    return true;
  }

  bool ConsumeWord(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // A plain string literal; numpy's keys and descr never need escapes, so a backslash is an
  // error rather than something to interpret.
  absl::StatusOr<std::string> ParseString() {
    const char quote = Peek();
    if (quote != '\'' && quote != '"') return Error("expected a quoted string");
    ++pos_;
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return Error("unterminated string");
    std::string_view s = text_.substr(pos_, end - pos_);
    if (s.find('\\') != std::string_view::npos)
      return Error("escapes in strings are not supported");
    pos_ = end + 1;
    return std::string(s);
  }

  absl::StatusOr<bool> ParseBool() {
    if (ConsumeWord("True")) return true;
    if (ConsumeWord("False")) return false;
    return Error("fortran_order must be True or False");
  }

  absl::StatusOr<std::vector<int64_t>> ParseShape() {
    std::vector<int64_t> dims;
    if (!Consume('(')) return Error("shape must be a tuple");
    while (true) {
      SkipSpace();
      if (Consume(')')) return dims;
      if (Peek() == '-') return Invalid(name_, "shape: dims must be >= 0");
      if (Peek() < '0' || Peek() > '9') return Error("shape: expected an integer");
      int64_t v = 0;
      while (Peek() >= '0' && Peek() <= '9') {
        if (__builtin_mul_overflow(v, int64_t{10}, &v) ||
            __builtin_add_overflow(v, static_cast<int64_t>(Peek() - '0'), &v)) {
          return Invalid(name_, "shape: a dim does not fit in int64");
        }
        ++pos_;
      }
      Consume('L');  // Python 2 wrote longs with a suffix
      dims.push_back(v);
      SkipSpace();
      if (Consume(',')) continue;
      SkipSpace();
      if (Consume(')')) return dims;
      return Error("shape: expected ',' or ')'");
    }
  }

  std::string_view text_;
  absl::string_view name_;
  size_t pos_ = 0;
};

// Maps a descr to our dtype, applying the caller's `want`.
absl::StatusOr<DType> ResolveDType(const std::string& descr, std::optional<DType> want,
                                   absl::string_view name) {
  std::optional<DType> file_dtype;
  bool raw_bf16 = false;
  if (descr == "<f4") {
    file_dtype = DType::kF32;
  } else if (descr == "<f2") {
    file_dtype = DType::kF16;
  } else if (descr == "<u2" || descr == "|V2" || descr == "<V2") {
    raw_bf16 = true;
  } else if (!descr.empty() && descr[0] == '>') {
    return Invalid(name, absl::StrCat("dtype '", descr,
                                      "' is big-endian; only little-endian data is supported"));
  } else {
    return Invalid(name, absl::StrCat("dtype '", descr,
                                      "' is not supported (want <f4, <f2, or <u2/|V2 for bf16)"));
  }
  if (raw_bf16) {
    if (!want.has_value()) {
      return Invalid(name,
                     absl::StrCat("dtype '", descr,
                                  "' is read only as raw bf16 bits; ask for bf16 to read it"));
    }
    if (*want != DType::kBF16) {
      return Invalid(name, absl::StrCat("dtype '", descr, "' holds bf16 bits, but ", Name(*want),
                                        " was asked for"));
    }
    return DType::kBF16;
  }
  if (want.has_value() && *want != *file_dtype) {
    return Invalid(name, absl::StrCat("dtype '", descr, "' is ", Name(*file_dtype), ", but ",
                                      Name(*want), " was asked for"));
  }
  return *file_dtype;
}

// Parses everything before the data. `head` holds at least the first `data_offset` bytes.
absl::StatusOr<NpyLayout> ParseHead(std::string_view head, std::optional<DType> want,
                                    absl::string_view name) {
  size_t header_start = 0;
  ATTN_ASSIGN_OR_RETURN(const size_t data_offset, ParsePreamble(head, name, &header_start));
  if (head.size() < data_offset) {
    return Invalid(name, absl::StrCat("truncated .npy header (", data_offset,
                                      " header bytes declared, file has ", head.size(), ")"));
  }
  NpyLayout layout;
  layout.data_offset = data_offset;
  bool fortran_order = false;
  HeaderParser parser(head.substr(header_start, data_offset - header_start), name);
  ATTN_RETURN_IF_ERROR(parser.Parse(&layout.descr, &fortran_order, &layout.dims));
  if (fortran_order) {
    return Invalid(name, "fortran_order is True; only C-order (row-major) arrays are supported");
  }
  ATTN_ASSIGN_OR_RETURN(layout.dtype, ResolveDType(layout.descr, want, name));
  return layout;
}

// The shape as Python writes a tuple: "()", "(5,)", "(2, 3)". Used for the header and for
// messages, so that both read like the header text.
std::string ShapeTuple(const std::vector<int64_t>& dims) {
  if (dims.size() == 1) return absl::StrCat("(", dims[0], ",)");
  return absl::StrCat("(", absl::StrJoin(dims, ", "), ")");
}

// Checks that the data section holds exactly the elements the shape calls for.
absl::Status CheckDataLength(const NpyLayout& layout, uint64_t data_bytes, absl::string_view name) {
  uint64_t want_bytes = DTypeSize(layout.dtype);
  bool overflow = false;
  for (int64_t d : layout.dims) {
    overflow =
        overflow || __builtin_mul_overflow(want_bytes, static_cast<uint64_t>(d), &want_bytes);
  }
  const std::string shape = ShapeTuple(layout.dims);
  if (overflow) {
    return Invalid(name, absl::StrCat("shape ", shape, " of ", layout.descr, " overflows"));
  }
  if (data_bytes != want_bytes) {
    return Invalid(name, absl::StrCat("data is ", data_bytes, " bytes, but shape ", shape, " of ",
                                      layout.descr, " needs ", want_bytes));
  }
  return absl::OkStatus();
}

std::string Descr(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "<f4";
    case DType::kF16:
      return "<f2";
    case DType::kBF16:
      return "<u2";
  }
  return "";
}

// The header (preamble included) exactly as numpy's np.save writes it for the same array.
std::string BuildHeader(const HostTensor& t) {
  // A default-constructed tensor has no elements; (0,) keeps the file loadable.
  std::vector<int64_t> dims = t.empty() ? std::vector<int64_t>{0} : t.dims();
  std::string dict = absl::StrCat("{'descr': '", Descr(t.dtype()),
                                  "', 'fortran_order': False, 'shape': ", ShapeTuple(dims), ", }");
  if (!dims.empty()) {
    const size_t digits = absl::StrCat(dims[0]).size();
    dict.append(kGrowthAxisMaxDigits - std::min(digits, kGrowthAxisMaxDigits), ' ');
  }
  // Version 1.0 unless the header length does not fit its 2-byte field.
  const size_t hlen = dict.size() + 1;  // + the final '\n'
  size_t prefix = kMagic.size() + 2 + 2;
  size_t pad = kArrayAlign - (prefix + hlen) % kArrayAlign;
  uint8_t major = 1;
  if (hlen + pad > 65535) {
    major = 2;
    prefix = kMagic.size() + 2 + 4;
    pad = kArrayAlign - (prefix + hlen) % kArrayAlign;
  }
  const size_t total_len = hlen + pad;
  std::string out;
  out.reserve(prefix + total_len);
  out.append(kMagic);
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  for (size_t i = 0; i < prefix - kMagic.size() - 2; ++i) {
    out.push_back(static_cast<char>((total_len >> (8 * i)) & 0xff));
  }
  out.append(dict);
  out.append(pad, ' ');
  out.push_back('\n');
  return out;
}

// Closes a file descriptor on scope exit.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  // Closes now and reports the error close() may return (deferred write errors on some
  // filesystems).
  int Close() { return ::close(std::exchange(fd_, -1)); }

 private:
  int fd_;
};

absl::Status ReadFully(int fd, char* dst, size_t n, const std::string& path) {
  while (n > 0) {
    // read() moves at most ~2 GiB per call on Linux, so large tensors take several calls.
    const ssize_t got = ::read(fd, dst, n);
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read failed"));
    }
    if (got == 0) return Invalid(path, "file ended early (was it truncated while being read?)");
    dst += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status WriteFully(int fd, const char* src, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t put = ::write(fd, src, n);
    if (put < 0) {
      if (errno == EINTR) continue;
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": write failed"));
    }
    src += put;
    n -= static_cast<size_t>(put);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<HostTensor> ParseNpy(std::string_view bytes, std::optional<DType> want,
                                    MemoryTracker* tracker) {
  constexpr absl::string_view kName = "npy";
  ATTN_ASSIGN_OR_RETURN(NpyLayout layout, ParseHead(bytes, want, kName));
  const std::string_view data = bytes.substr(layout.data_offset);
  ATTN_RETURN_IF_ERROR(CheckDataLength(layout, data.size(), kName));
  ATTN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(layout.dtype, layout.dims, tracker));
  if (!data.empty()) std::memcpy(t.data(), data.data(), data.size());
  return t;
}

std::string SerializeNpy(const HostTensor& t) {
  std::string out = BuildHeader(t);
  if (!t.empty()) out.append(reinterpret_cast<const char*>(t.data()), t.nbytes());
  return out;
}

absl::StatusOr<HostTensor> ReadNpy(const std::string& path, std::optional<DType> want,
                                   MemoryTracker* tracker) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot open"));
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot stat"));
  }
  if (!S_ISREG(st.st_mode)) return Invalid(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  // The preamble first, then the header it announces; the data is read straight into the tensor
  // so that a file never costs twice its size in memory.
  std::string head(std::min<uint64_t>(file_size, 12), '\0');
  ATTN_RETURN_IF_ERROR(ReadFully(fd.get(), head.data(), head.size(), path));
  size_t header_start = 0;
  ATTN_ASSIGN_OR_RETURN(const size_t data_offset, ParsePreamble(head, path, &header_start));
  if (data_offset > file_size) {
    return Invalid(path, absl::StrCat("truncated .npy header (", data_offset,
                                      " header bytes declared, file has ", file_size, ")"));
  }
  const size_t have = head.size();
  head.resize(data_offset);
  if (data_offset > have) {
    ATTN_RETURN_IF_ERROR(ReadFully(fd.get(), head.data() + have, data_offset - have, path));
  } else if (data_offset < have) {
    // The header was shorter than the 12 bytes read (only possible for a malformed 1.0 file);
    // step back to where the data starts.
    if (::lseek(fd.get(), static_cast<off_t>(data_offset), SEEK_SET) < 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat(path, ": seek failed"));
    }
  }
  ATTN_ASSIGN_OR_RETURN(NpyLayout layout, ParseHead(head, want, path));
  ATTN_RETURN_IF_ERROR(CheckDataLength(layout, file_size - data_offset, path));
  ATTN_ASSIGN_OR_RETURN(HostTensor t, HostTensor::Create(layout.dtype, layout.dims, tracker));
  ATTN_RETURN_IF_ERROR(ReadFully(fd.get(), reinterpret_cast<char*>(t.data()), t.nbytes(), path));
  return t;
}

absl::Status WriteNpy(const std::string& path, const HostTensor& t) {
  if (t.empty()) {
    return Invalid(path, "cannot write an empty (default-constructed or moved-from) tensor");
  }
  Fd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": cannot create"));
  // Header and data go out separately so that the data is never copied.
  const std::string header = BuildHeader(t);
  absl::Status status = WriteFully(fd.get(), header.data(), header.size(), path);
  if (status.ok()) {
    status = WriteFully(fd.get(), reinterpret_cast<const char*>(t.data()), t.nbytes(), path);
  }
  if (fd.Close() != 0 && status.ok()) {
    status = absl::ErrnoToStatus(errno, absl::StrCat(path, ": close failed"));
  }
  // A half-written file would later read back as a confusing length error; remove it.
  if (!status.ok()) ::unlink(path.c_str());
  return status;
}

}  // namespace attnserve
