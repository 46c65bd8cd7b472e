package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// Media types of the OCI image spec (v1.0).
const (
	mediaIndex    = "application/vnd.oci.image.index.v1+json"
	mediaManifest = "application/vnd.oci.image.manifest.v1+json"
	mediaConfig   = "application/vnd.oci.image.config.v1+json"
	mediaLayer    = "application/vnd.oci.image.layer.v1.tar"
)

// Image is what goes into the archive: one layer made of Rootfs, and the
// process settings of the image config.
type Image struct {
	// Name is the reference containerd registers the image under
	// (annotation io.containerd.image.name).
	Name string
	// Rootfs is the directory packed as the layer: regular files,
	// directories and symlinks; anything else is an error.
	Rootfs     string
	Entrypoint []string
	Cmd        []string
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

type manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        descriptor   `json:"config"`
	Layers        []descriptor `json:"layers"`
}

type index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []descriptor `json:"manifests"`
}

type imageConfig struct {
	Architecture string        `json:"architecture"`
	OS           string        `json:"os"`
	Config       processConfig `json:"config"`
	RootFS       rootFS        `json:"rootfs"`
}

type processConfig struct {
	Env        []string `json:"Env"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	WorkingDir string   `json:"WorkingDir"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// epoch is every entry's modification time: the archive depends only on
// the files' contents, modes and names.
var epoch = time.Unix(0, 0).UTC()

// Write writes img as an OCI image layout archive to w.
func Write(w io.Writer, img Image) error {
	var layer bytes.Buffer
	if err := writeLayer(&layer, img.Rootfs); err != nil {
		return fmt.Errorf("layer from %s: %w", img.Rootfs, err)
	}
	layerDesc := describe(mediaLayer, layer.Bytes())
	cfg, err := json.Marshal(imageConfig{
		Architecture: "amd64",
		OS:           "linux",
		Config: processConfig{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			WorkingDir: "/",
		},
		// Uncompressed: the layer's digest is its diff ID.
		RootFS: rootFS{Type: "layers", DiffIDs: []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	cfgDesc := describe(mediaConfig, cfg)
	man, err := json.Marshal(manifest{SchemaVersion: 2, MediaType: mediaManifest, Config: cfgDesc, Layers: []descriptor{layerDesc}})
	if err != nil {
		return err
	}
	manDesc := describe(mediaManifest, man)
	manDesc.Platform = &platform{Architecture: "amd64", OS: "linux"}
	manDesc.Annotations = map[string]string{
		"io.containerd.image.name":          img.Name,
		"org.opencontainers.image.ref.name": img.Name,
	}
	idx, err := json.Marshal(index{SchemaVersion: 2, MediaType: mediaIndex, Manifests: []descriptor{manDesc}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	files := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", idx},
		{blobPath(manDesc), man},
		{blobPath(cfgDesc), cfg},
		{blobPath(layerDesc), layer.Bytes()},
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(f.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func describe(mediaType string, data []byte) descriptor {
	sum := sha256.Sum256(data)
	return descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(data))}
}

func blobPath(d descriptor) string {
	return "blobs/sha256/" + d.Digest[len("sha256:"):]
}

// writeLayer tars the tree under root, sorted by path, every entry owned
// by 0:0 and dated at the epoch.
func writeLayer(w io.Writer, root string) error {
	var paths []string
	err := filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != root {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	sort.Strings(paths)
	tw := tar.NewWriter(w)
	for _, p := range paths {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case fi.Mode().IsDir():
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
		case fi.Mode().IsRegular():
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
		default:
			return fmt.Errorf("%s: only files, directories and symlinks go into a layer (mode %s)", rel, fi.Mode())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg {
			if err := copyFile(tw, p); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}

func copyFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}
