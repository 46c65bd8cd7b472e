package sysfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAttrReader_BehavesLikeFS(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"state": "live\n",
		"model": "pathmend-lab" + strings.Repeat(" ", 28) + "\n",
		"empty": "",
		"long":  strings.Repeat("x", maxAttrSize+1),
		"page":  strings.Repeat("y", maxAttrSize),
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	fsys := New(dir)
	r := NewAttrReader(fsys)
	// Twice, so the second pass reads through a used buffer.
	for range 2 {
		for _, name := range []string{"state", "model", "empty", "long", "page", "missing"} {
			want, wantErr := fsys.ReadAttr(name)
			got, err := r.ReadAttr(name)
			if got != want || (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Errorf("ReadAttr(%s) = %q, %v; FS gives %q, %v", name, got, err, want, wantErr)
			}
			wantV, wantOK, wantErr := fsys.ReadOptionalAttr(name)
			gotV, gotOK, err := r.ReadOptionalAttr(name)
			if gotV != wantV || gotOK != wantOK || (err == nil) != (wantErr == nil) {
				t.Errorf("ReadOptionalAttr(%s) = %q, %t, %v; FS gives %q, %t, %v", name, gotV, gotOK, err, wantV, wantOK, wantErr)
			}
		}
	}
}
