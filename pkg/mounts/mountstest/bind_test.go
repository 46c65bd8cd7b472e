package mountstest_test

import "golang.org/x/sys/unix"

func bind(src, dst string) error { return unix.Mount(src, dst, "", unix.MS_BIND, "") }
