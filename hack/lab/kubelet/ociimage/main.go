// Command ociimage packs a directory into a single-layer container image
// and writes it as an OCI image layout archive, the format
// `ctr images import` reads. The kubelet lab builds its pod images with it
// from files it has locally (a static busybox from Debian's busybox-static,
// its own pause binary), so nothing is pulled from a registry.
//
//	ociimage -name localhost/pathmend-lab/busybox:1 -rootfs DIR \
//	    -entrypoint '["/bin/sh"]' [-cmd '["-c","..."]'] -o busybox.tar
//
// The archive is reproducible: entries are sorted, owned by 0:0 and dated
// at the Unix epoch, so the same directory gives the same image digest.
// The layer is an uncompressed tar; the platform is linux/amd64.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fl := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	name := fl.String("name", "", "image reference, e.g. localhost/pathmend-lab/busybox:1 (required)")
	rootfs := fl.String("rootfs", "", "directory packed as the image's only layer (required)")
	entrypoint := fl.String("entrypoint", "", "entrypoint as a JSON array of strings")
	cmd := fl.String("cmd", "", "command as a JSON array of strings")
	out := fl.String("o", "", "archive to write (required)")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if *name == "" || *rootfs == "" || *out == "" {
		return errors.New("-name, -rootfs and -o are required")
	}
	img := Image{Name: *name, Rootfs: *rootfs}
	for flagName, p := range map[string]struct {
		text string
		into *[]string
	}{"-entrypoint": {*entrypoint, &img.Entrypoint}, "-cmd": {*cmd, &img.Cmd}} {
		if p.text == "" {
			continue
		}
		if err := json.Unmarshal([]byte(p.text), p.into); err != nil {
			return fmt.Errorf("%s: want a JSON array of strings: %w", flagName, err)
		}
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := Write(f, img); err != nil {
		f.Close()
		os.Remove(*out)
		return err
	}
	return f.Close()
}
