//go:build !race

package mvcc_test

const raceBuild = false
