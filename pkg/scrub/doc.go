// Package scrub keeps the secret values a pathmend process has seen and
// removes them from every text the process lets out: gRPC error
// messages, every log line (text and JSON, at every -v), the metrics
// page, diagnose's output; and it is asked before a record or a learned
// file is written whether the file would hold one.
//
// A Set knows each value in the forms a text may carry it: as is; as the
// escapes of a JSON string and of a Go quoted string put it (once and
// twice: a JSON dump logged as a quoted value); base64 (standard and URL
// alphabets, padded and not, and the part of it that stays the same at
// any offset inside a longer encoded text); hex (lower and upper case);
// URL query and path escaping. Each occurrence of any form is replaced
// with "***", wherever the text came from: iscsiadm, nvme, mount, the
// kernel, pathmend itself.
//
// It learns by shape too: a DH-HMAC-CHAP key ("DHHC-1:<hash>:<base64>:")
// and the value of an iSCSI node record's CHAP setting
// ("node.session.auth.password = …", any "*.auth.username*" or
// "*.auth.password*") are replaced wherever they appear and added to the
// set, so a node record read back, or a key the kernel prints, is
// scrubbed from then on in every form, even when pathmend was never given
// it.
//
// A value of fewer than four bytes is replaced only where it stands as a
// whole word (its neighbours are not letters or digits): as a substring
// it would be every other word. Its encoded forms are not searched for
// (they would match ordinary text). A Set holds at most MaxValues values;
// past that it forgets the oldest, and says so once in the log.
//
// The cost on the hot path (every log line): a Set that knows nothing
// returns the text unchanged after one atomic load, plus two substring
// searches for the learnt shapes; a Set that knows values tests each byte
// pair of the text against a bitmap of the first two bytes of every form
// and compares only where one starts (BenchmarkString).
//
// Default is the process's Set: the set of secrets a process has seen is
// the process's, as its log output is. Tests make their own with New.
package scrub
