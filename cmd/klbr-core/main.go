package main
import (
 _ "github.com/mattn/go-sqlite3"
 _ "github.com/spf13/cobra"
 _ "github.com/prometheus/client_golang/prometheus"
 _ "github.com/pelletier/go-toml/v2"
 _ "golang.org/x/sys/unix"
)
func main(){}
