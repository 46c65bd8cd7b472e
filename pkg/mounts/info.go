package mounts

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	mount "k8s.io/mount-utils"
)

// SelfMountInfo is this process's mount table.
const SelfMountInfo = "/proc/self/mountinfo"

// maxMountInfo bounds one read of a mount table: about 40,000 mounts.
const maxMountInfo = 16 << 20

// ReadInfo reads a mountinfo file (proc(5)) in one bounded read. Unlike
// mount-utils' parser it undoes the octal escapes the kernel writes for
// a space, a tab, a newline and a backslash in a path or a source, so a
// path with one compares equal to its mount point.
func ReadInfo(path string) ([]mount.MountInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return readInfo(f, path)
}

// readInfo reads the mountinfo text of path from r in one bounded read
// and parses it.
func readInfo(r io.Reader, path string) ([]mount.MountInfo, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxMountInfo+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxMountInfo {
		return nil, fmt.Errorf("read %s: larger than %d bytes", path, maxMountInfo)
	}
	infos, err := ParseInfo(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return infos, nil
}

// ParseInfo parses mountinfo text.
func ParseInfo(b []byte) ([]mount.MountInfo, error) {
	var out []mount.MountInfo
	for n, line := range bytes.Split(b, []byte{'\n'}) {
		if len(line) == 0 {
			continue
		}
		mi, err := parseLine(string(line))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n+1, err)
		}
		out = append(out, mi)
	}
	return out, nil
}

func parseLine(line string) (mount.MountInfo, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return mount.MountInfo{}, fmt.Errorf("%d fields, want at least 10", len(f))
	}
	var mi mount.MountInfo
	var err error
	if mi.ID, err = strconv.Atoi(f[0]); err != nil {
		return mi, fmt.Errorf("mount ID: %w", err)
	}
	if mi.ParentID, err = strconv.Atoi(f[1]); err != nil {
		return mi, fmt.Errorf("parent ID: %w", err)
	}
	maj, min, ok := strings.Cut(f[2], ":")
	if !ok {
		return mi, fmt.Errorf("device %q: want major:minor", f[2])
	}
	if mi.Major, err = strconv.Atoi(maj); err != nil {
		return mi, fmt.Errorf("device %q: %w", f[2], err)
	}
	if mi.Minor, err = strconv.Atoi(min); err != nil {
		return mi, fmt.Errorf("device %q: %w", f[2], err)
	}
	mi.Root, mi.MountPoint = unescape(f[3]), unescape(f[4])
	mi.MountOptions = strings.Split(f[5], ",")
	i := 6
	for ; i < len(f) && f[i] != "-"; i++ {
		mi.OptionalFields = append(mi.OptionalFields, f[i])
	}
	if len(f)-i-1 < 3 {
		return mi, errors.New("no filesystem type, source and options after the separator")
	}
	mi.FsType, mi.Source = unescape(f[i+1]), unescape(f[i+2])
	mi.SuperOptions = strings.Split(f[i+3], ",")
	return mi, nil
}

// unescape undoes the kernel's \ooo escapes (show_mountinfo's mangle:
// space, tab, newline, backslash).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1:i+4]) {
			n, _ := strconv.ParseUint(s[i+1:i+4], 8, 8)
			b.WriteByte(byte(n))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(s string) bool {
	if len(s) != 3 {
		return false
	}
	for i := range 3 {
		if s[i] < '0' || s[i] > '7' {
			return false
		}
	}
	return s[0] <= '3'
}
