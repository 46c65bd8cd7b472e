package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestCondition(t *testing.T) {
	dir := t.TempDir()
	attr := filepath.Join(dir, "state")
	watch := filepath.Join(dir, "watch")
	write := func(p, s string) {
		t.Helper()
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}

	if condition("") != nil {
		t.Error("no watch file: want no condition")
	}
	if condition(filepath.Join(dir, "missing")) != nil {
		t.Error("unreadable watch file: want no condition")
	}
	write(watch, "\n")
	if condition(watch) != nil {
		t.Error("empty watch file: want no condition")
	}

	write(watch, attr+"\n")
	cond := condition(watch)
	if cond == nil {
		t.Fatal("watch file names an attribute: want a condition")
	}
	if cond() {
		t.Error("attribute missing: condition holds")
	}
	write(attr, "up\n")
	if cond() {
		t.Error(`attribute "up": condition holds`)
	}
	write(attr, "bound\n")
	if !cond() {
		t.Error(`attribute "bound": condition does not hold`)
	}
}
