package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
)

// ExportKind is where an exported region's memory comes from.
type ExportKind int

// Export kinds.
const (
	// ExportAnon is zeroed anonymous memory, gone when the daemon exits.
	ExportAnon ExportKind = iota
	// ExportFile maps an existing file: remote WRITEs land in the file.
	ExportFile
	// ExportShm maps a POSIX shared-memory object (/dev/shm/NAME), created
	// with the given size when it does not exist.
	ExportShm
)

func (k ExportKind) String() string {
	switch k {
	case ExportFile:
		return "file"
	case ExportShm:
		return "shm"
	}
	return "anon"
}

// ExportSpec describes one named memory region the daemon exports.
type ExportSpec struct {
	Name     string
	Kind     ExportKind
	Path     string // file path, or the shm object's name
	Size     int64  // bytes; 0 for a file means the whole file
	ReadOnly bool
}

// ShmDir is where shared-memory objects live.
var ShmDir = "/dev/shm"

// ParseExport parses an --export value:
//
//	NAME=anon,size=64M
//	NAME=file:/var/lib/rxed/data.img[,size=1G][,ro]
//	NAME=shm:rxed-data,size=16M[,ro]
func ParseExport(v string) (ExportSpec, error) {
	var s ExportSpec
	name, rest, ok := strings.Cut(v, "=")
	if !ok || name == "" || rest == "" {
		return s, fmt.Errorf("export %q: want NAME=anon|file:PATH|shm:NAME[,size=N][,ro]", v)
	}
	s.Name = name
	parts := strings.Split(rest, ",")
	src := parts[0]
	switch {
	case src == "anon":
		s.Kind = ExportAnon
	case strings.HasPrefix(src, "file:"):
		s.Kind, s.Path = ExportFile, strings.TrimPrefix(src, "file:")
	case strings.HasPrefix(src, "shm:"):
		s.Kind, s.Path = ExportShm, strings.TrimPrefix(src, "shm:")
		if strings.Contains(s.Path, "/") {
			return s, fmt.Errorf("export %s: shm object name %q must not contain '/'", name, s.Path)
		}
	default:
		return s, fmt.Errorf("export %s: source %q: want anon, file:PATH or shm:NAME", name, src)
	}
	if (s.Kind == ExportFile || s.Kind == ExportShm) && s.Path == "" {
		return s, fmt.Errorf("export %s: empty %s path", name, s.Kind)
	}
	for _, p := range parts[1:] {
		k, val, _ := strings.Cut(p, "=")
		switch k {
		case "size":
			n, err := ParseBytes(val)
			if err != nil {
				return s, fmt.Errorf("export %s: %v", name, err)
			}
			s.Size = n
		case "ro":
			s.ReadOnly = true
		default:
			return s, fmt.Errorf("export %s: unknown option %q (want size=N or ro)", name, p)
		}
	}
	if s.Kind != ExportFile && s.Size <= 0 {
		return s, fmt.Errorf("export %s: %s needs size=N", name, s.Kind)
	}
	if s.Kind == ExportAnon && s.ReadOnly {
		return s, fmt.Errorf("export %s: a read-only anonymous region would only ever hold zeros", name)
	}
	return s, nil
}

// ParseBytes parses a byte count with an optional K, M, G or T suffix
// (powers of 1024).
func ParseBytes(v string) (int64, error) {
	mult := int64(1)
	t := strings.ToUpper(strings.TrimSpace(v))
	t = strings.TrimSuffix(t, "B")
	t = strings.TrimSuffix(t, "I")
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<50)/mult {
		return 0, fmt.Errorf("size %q: want a byte count such as 4096, 64M or 1G", v)
	}
	return n * mult, nil
}

func (s ExportSpec) String() string {
	src := s.Kind.String()
	if s.Path != "" {
		src += ":" + s.Path
	}
	out := s.Name + "=" + src
	if s.Size > 0 {
		out += ",size=" + strconv.FormatInt(s.Size, 10)
	}
	if s.ReadOnly {
		out += ",ro"
	}
	return out
}

// Export is a mapped and registered region.
type Export struct {
	Spec    ExportSpec
	Mapping *mr.Mapping
	MR      *ib.MR
}

// Access is what remote peers may do to the export.
func (e *Export) Access() ib.Access {
	if e.Spec.ReadOnly {
		return ib.AccessRemoteRead
	}
	a := ib.AccessLocalWrite | ib.AccessRemoteWrite | ib.AccessRemoteRead | ib.AccessRemoteAtomic | ib.AccessFlushGlobal
	if e.Spec.Kind != ExportAnon {
		a |= ib.AccessFlushPersistent
	}
	return a
}

// mapExport maps the memory of spec. Errors name the export and the
// problem in one line (missing file, too small, ...).
func mapExport(spec ExportSpec) (*mr.Mapping, error) {
	switch spec.Kind {
	case ExportAnon:
		m, err := mr.MapAnonymous(int(spec.Size))
		if err != nil {
			return nil, fmt.Errorf("export %s: %v", spec.Name, err)
		}
		return m, nil
	case ExportShm:
		p := filepath.Join(ShmDir, spec.Path)
		if !spec.ReadOnly {
			f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
			if err != nil {
				return nil, fmt.Errorf("export %s: shm object %s: %v", spec.Name, p, err)
			}
			fi, err := f.Stat()
			if err == nil && fi.Size() < spec.Size {
				err = f.Truncate(spec.Size)
			}
			f.Close()
			if err != nil {
				return nil, fmt.Errorf("export %s: shm object %s: %v", spec.Name, p, err)
			}
		}
		return mapPath(spec, p)
	}
	return mapPath(spec, spec.Path)
}

func mapPath(spec ExportSpec, p string) (*mr.Mapping, error) {
	m, err := mr.MapFile(p, int(spec.Size), !spec.ReadOnly)
	switch {
	case err == nil:
		return m, nil
	case errors.Is(err, os.ErrNotExist):
		// The hints say what to do, as the empty file's does: the file is
		// the operator's to create (the daemon never makes one up).
		return nil, fmt.Errorf("export %s: file %s does not exist (create it first, e.g. truncate -s 1G %s, or export anon or shm memory)", spec.Name, p, p)
	case errors.Is(err, mr.ErrFileTooSmall):
		fi, _ := os.Stat(p)
		have := int64(0)
		if fi != nil {
			have = fi.Size()
		}
		return nil, fmt.Errorf("export %s: file %s is too small: %d bytes, size=%d requested (grow it: truncate -s %d %s)", spec.Name, p, have, spec.Size, spec.Size, p)
	case errors.Is(err, mr.ErrEmptyBuffer):
		return nil, fmt.Errorf("export %s: file %s is empty (give it a size, e.g. truncate -s 1G %s)", spec.Name, p, p)
	}
	return nil, fmt.Errorf("export %s: %v", spec.Name, err)
}
